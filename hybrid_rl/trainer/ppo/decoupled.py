"""The decoupled (asynchronous) mode of the PPO trainer: ``async_training.enable=true``.

The same :meth:`RayPPOTrainer.fit` and named steps; only the hook points differ:

* :meth:`init_workers` starts two pools: training (actor + ref (+ critic)) and rollout
  (``rollout.nnodes x n_gpus_per_node``), placed by Ray resources;
* a :class:`~hybrid_rl.trainer.ppo.producer.RolloutProducer` generates and scores on the rollout pool
  (a local learned reward model lives in the rollout processes, beside the engine)
  without waiting for the trainer, within the staleness bound ``max_head_offpolicyness`` (eta), into
  the experience buffer (``async_training.buffer``);
* :meth:`step_plan` replaces ``generate`` + ``compute_reward`` with ``take_experiences`` (stale rows
  dropped first, counted) and adds ``sync_rollout_weights`` every ``trigger_parameter_sync_step``
  updates; validation loads the trainer's current weights into the rollout pool first;
* checkpoints carry where the producer resumes (and the memory buffer's rows); a resumed run puts
  rows taken after the checkpoint back to ready and never generates a batch that is already buffered.

Versions: the trainer's weights after step ``k`` are version ``k``; step ``k`` trains version ``k - 1``
on rows whose ``policy_version`` is at least ``k - 1 - eta``. With eta = 0 the order of every
operation is the synchronous one, and the run reproduces the colocated run's weights.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from typing import Any

from hybrid_rl.buffer import MemoryBuffer, batch_from_experiences, build_buffer
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.ppo.contracts import decoupled_batch_plan
from hybrid_rl.trainer.ppo.producer import ProducerState, RolloutProducer
from hybrid_rl.trainer.ppo.stream_groups import agent_batch_metrics
from hybrid_rl.trainer.ppo.stream_producer import StreamingProducer, streaming_producer
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from hybrid_rl.workers.weight_transfer import PushLedger, WeightHandle, choose_transport

__all__ = ["DecoupledPPOTrainer", "staleness_metrics"]

logger = logging.getLogger(__name__)

_POLL_S = 0.02


def staleness_metrics(versions: list[int], trainer_version: int) -> dict[str, float]:
    """``async/staleness_{mean,max}`` and the histogram ``async/staleness_hist/<s>`` (fraction of
    rows ``s`` versions behind ``trainer_version``). A negative lag (a row of newer weights than the
    trainer's) is reported as it is: a resume discards such rows, so one would be a bug to see."""
    lags = [trainer_version - int(v) for v in versions]
    out = {"async/staleness_mean": sum(lags) / len(lags), "async/staleness_max": float(max(lags))}
    for lag, count in sorted(Counter(lags).items()):
        out[f"async/staleness_hist/{lag}"] = count / len(lags)
    return out


class DecoupledPPOTrainer(RayPPOTrainer):
    """:class:`RayPPOTrainer` with rollout and training decoupled (see the module docstring)."""

    def __init__(self, config, tokenizer=None, **kwargs: Any):
        super().__init__(config, tokenizer, **kwargs)
        a = self.config.async_training
        if not a.enable:
            raise ValueError("DecoupledPPOTrainer needs async_training.enable=true (or use RayPPOTrainer).")
        self.eta = a.max_head_offpolicyness
        self.rows_per_batch = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
        self.buffer = None
        self.producer: RolloutProducer | None = None
        self._producer_state = ProducerState(1, self.train_dataloader.state_dict())
        self.dropped_total = 0
        self._buffered_groups: frozenset = frozenset()  # (batch, group) already buffered: a resumed stream skips them
        self.discarded_newer = 0  # rows of the dead run's newer weights discarded at resume

    # ------------------------------------------------------------------ set-up and teardown
    def _begin_fit(self) -> dict[str, float]:
        self.buffer = build_buffer(self.config.async_training.buffer, self.run_dir, self.config.trainer.experiment_name)
        self._producer_state = ProducerState(1, self.train_dataloader.state_dict())
        metrics = super()._begin_fit()  # resume (load_checkpoint), validation before training
        common = dict(loader=self.train_dataloader, state=self._producer_state, score=self.score_rollout,
                      buffer=self.buffer, tokenizer=self.tokenizer, eta=self.eta, taken_batches=self.global_steps,
                      ready_batches=-(-self.buffer.count("ready") // self.rows_per_batch), timeline=self.timeline)
        if self.config.async_training.partial_rollout:
            self.producer = streaming_producer(self, common)
        else:
            self.producer = RolloutProducer(generate=self.generate_batch, load_weights=self._load_rollout_weights,
                                            **common)
        self.producer.offer_weights(self._export_weights(), self.global_steps)
        self.producer.start()
        return metrics

    def _end_fit(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            if self.producer.error is not None:  # a failure after the last take: say so, never silently
                logger.error("the rollout producer had failed after the last step it fed: %r", self.producer.error)
            self.producer = None  # later validation loads weights inline
        try:
            super()._end_fit()
        finally:
            if getattr(self, "weight_pushes", None) is not None:
                self.weight_pushes.release_all()  # pushes offered and never loaded
                self._close_weight_exports()
            if self.buffer is not None:
                self.buffer.close()

    def _close_weight_exports(self) -> None:
        """Give the shared memory of the run's pushes back (a failure only logged: teardown goes on)."""
        try:
            self.actor_rollout_wg.close_weight_exports()
        except Exception as error:  # noqa: BLE001 - a dead trainer worker: the next export sweeps its segments
            logger.warning("weight transfer: the trainer's shared-memory segments were not unlinked: %r", error)

    def _batches(self):
        """One placeholder per step: the rows come from the buffer (``take_experiences``)."""
        while self.global_steps < self.total_training_steps:
            yield DataProto()

    def _export_weights(self) -> WeightHandle:
        """The trainer's current weights, written once into buckets of
        ``async_training.update_weights_bucket_megabytes`` MiB over ``async_training.weight_transport``
        (docs/async.md, "Weight transfer"); the driver holds only the handle's metadata."""
        if getattr(self, "weight_pushes", None) is None:
            self.weight_pushes = PushLedger(self.actor_rollout_wg.release_rollout_weights)
        a, infos = self.config.async_training, self.actor_rollout_wg.worker_infos
        transport = choose_transport(infos[0].node_ip, [i.node_ip for i in self.workers.rollout.worker_infos],
                                     a.weight_transport)
        return self.weight_pushes.offered(self.actor_rollout_wg.export_rollout_weights(
            transport=transport, bucket_bytes=a.update_weights_bucket_megabytes << 20)[0]["weights"])

    def _load_rollout_weights(self, exported: WeightHandle) -> dict[str, float]:
        """Load a push into every rollout worker, then free its buckets (and older unloaded ones)."""
        try:
            outputs = self.workers.rollout.load_rollout_weights(exported)
        finally:
            self.weight_pushes.loaded(exported)
        return {"timing_s/weight_load": max(o["timing_s/weight_load"] for o in outputs)}

    # ------------------------------------------------------------------ the step plan
    def declare_batch_plan(self) -> BatchPlan:
        """PPO's steps with the experience buffer's rows instead of generating and scoring."""
        return decoupled_batch_plan(super().declare_batch_plan(), self.config)

    def step_plan(self) -> list[str]:
        steps = [s for s in super().step_plan() if s not in ("generate", "compute_rm_score", "compute_reward")]
        steps.insert(0, "take_experiences")
        if self.global_steps % self.config.async_training.trigger_parameter_sync_step == 0 \
                and "validate" not in steps:  # validation pushes the weights itself
            tail = [s for s in ("validate", "save_checkpoint") if s in steps]
            steps.insert(steps.index(tail[0]) if tail else len(steps), "sync_rollout_weights")
        return steps

    def score_rollout(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """The producer's scoring of one generated batch (in its reward threads): the learned reward
        model's scores when there is one (remote, or the reward-model worker in the rollout
        processes), then the reward manager."""
        if self.config.reward_model.enable:
            batch = self.compute_rm_score(batch, metrics)
        return self.compute_reward(batch, metrics)

    def take_experiences(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Drop rows more than eta versions old, wait for one batch of ready rows, take them."""
        self.producer.check()  # a dead rollout is noticed at the next step, even with rows still buffered
        version = self.global_steps - 1  # the weights this step trains
        dropped = self._drop_stale(version)
        start, wall_start = time.perf_counter(), time.time()
        while True:
            if self.buffer.count("ready") >= self.rows_per_batch:
                late = self._drop_stale(version)  # a stale group that streamed in while the trainer waited
                dropped += late
                if not late or self.buffer.count("ready") >= self.rows_per_batch:
                    break
            self.producer.check()
            if self.producer.stalled() and self.buffer.count("ready") < self.rows_per_batch:
                raise RuntimeError(
                    f"training step {self.global_steps}: the rollout waits for the trainer while the buffer holds "
                    f"{self.buffer.count('ready')} ready rows, fewer than one batch ({self.rows_per_batch} = "
                    "data.train_batch_size x rollout.n). Fix: resume with the batch size and rollout.n the buffer "
                    "was written with, or start over with an empty async_training.buffer.path.")
            time.sleep(_POLL_S)
        # min_version: a stale group landing between the last drop and the take stays for the next drop
        experiences = self.buffer.take(self.rows_per_batch, step=self.global_steps, min_version=version - self.eta)
        self.producer.consumed(1)
        if self.config.trainer.save_freq <= 0 and isinstance(self.buffer, MemoryBuffer):
            self.buffer.forget_taken(self.global_steps)  # nothing can resume: no row needs keeping
        metrics["timing_s/trainer_idle"] = time.perf_counter() - start
        self.timeline.record("trainer", "wait_batch", wall_start, wall_start + metrics["timing_s/trainer_idle"])
        response_length = max([self.config.actor_rollout_ref.rollout.response_length]
                              + [len(e.response_ids) for e in experiences])
        batch = batch_from_experiences(experiences, self.tokenizer.pad_token_id, response_length)
        metrics.update(staleness_metrics([e.policy_version for e in experiences], version))
        spans = [int(hi) - int(lo) for lo, hi in zip(batch.non_tensor_batch["min_global_steps"],
                                                    batch.non_tensor_batch["max_global_steps"])]
        metrics["async/mixed_version_rows"] = sum(s > 0 for s in spans) / len(spans)  # partial rollout at work
        metrics.update(self.producer.pop_metrics({int(e.extra.get("rollout_batch", 0)) for e in experiences}))
        if isinstance(self.producer, StreamingProducer):  # the batch path's agent/* keys, over the rows trained
            metrics.update(agent_batch_metrics(batch.non_tensor_batch.get("agent_metrics", [])))
        metrics.update({"async/dropped_stale": dropped, "async/dropped_stale_total": self.dropped_total,
                        "async/discarded_newer_at_resume": self.discarded_newer,  # once, the step after a resume
                        "async/buffer_ready": self.buffer.count("ready"),
                        "async/rollout_version": float(self.producer.rollout_version or 0)})
        self.discarded_newer = 0
        return batch

    def _drop_stale(self, version: int) -> int:
        """Mark ready rows more than eta versions older than ``version`` dropped; the producer stops
        counting them as ready (whole groups when streaming: a group's rows share its oldest version)."""
        dropped = self.buffer.drop_stale(version, self.eta)
        if dropped and isinstance(self.producer, StreamingProducer):
            self.producer.dropped_rows(dropped, self.config.actor_rollout_ref.rollout.n)
        elif dropped:
            self.producer.dropped(-(-dropped // self.rows_per_batch))
        self.dropped_total += dropped
        return dropped

    def sync_rollout_weights(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Export the new weights from the trainer (the trainer waits only for this copy); the
        rollout loads them between two generations."""
        self.producer.offer_weights(self._export_weights(), self.global_steps)
        return batch

    def run_validation(self) -> dict[str, float]:
        """Validate the trainer's current weights: load them into the rollout pool first."""
        if self.val_dataset is None:
            return {}
        exported = self._export_weights()
        if self.producer is None:  # before or after training
            self._load_rollout_weights(exported)
            return super().run_validation()
        self.producer.offer_weights(exported, self.global_steps)
        return self.producer.call(super().run_validation, name="validate")

    # ------------------------------------------------------------------ checkpoints
    def _driver_state(self) -> dict[str, Any]:
        state = super()._driver_state()
        lock = self.producer.locked() if self.producer is not None else contextlib.nullcontext()
        with lock:  # no batch reaches the buffer between these two reads
            where = self.producer.state() if self.producer is not None else self._producer_state
            rows = self.buffer.state_dict() if isinstance(self.buffer, MemoryBuffer) else None
        state["dataloader"] = where.loader  # the producer's position, not the trainer's
        state["async"] = {"next_batch": where.next_batch, "skip_through": where.skip_through,
                          "buffer": rows, "dropped_total": self.dropped_total,
                          "storage_type": self.config.async_training.buffer.storage_type,
                          "rows_per_batch": self.rows_per_batch,
                          "ready_batches": sorted(set(self._batch_indices("ready")))}
        return state

    def _group_keys(self) -> frozenset:
        """``(rollout_batch, rollout_group)`` of every group in the buffer (the streaming producer's rows)."""
        pairs = zip(self.buffer.extra_values("rollout_batch"), self.buffer.extra_values("rollout_group"))
        return frozenset((int(b), int(g)) for b, g in pairs if b is not None and g is not None)

    def _batch_indices(self, status: str | None = None) -> list[int]:
        """The ``rollout_batch`` of every buffered row (of one status), read without the token ids."""
        return [int(v) for v in self.buffer.extra_values("rollout_batch", status) if v is not None]

    def save_checkpoint(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        batch = super().save_checkpoint(batch, metrics)
        if isinstance(self.buffer, MemoryBuffer):  # what the checkpoint made final need not stay
            self.buffer.forget_taken(self.global_steps)
        return batch

    def load_checkpoint(self) -> None:
        super().load_checkpoint()
        saved = (self.resumed_state or {}).get("async") or {}
        self._check_resumable(saved)
        if saved.get("buffer") is not None and isinstance(self.buffer, MemoryBuffer):
            self.buffer.load_state_dict(saved["buffer"])
        released = self.buffer.release_after(self.global_steps)
        # Rows the dead run sampled with weights trained after this checkpoint: those weights will never
        # exist again (this run trains its own), so the rows go and their prompts are generated anew.
        self.discarded_newer = self.buffer.discard_newer(self.global_steps)
        buffered = self._batch_indices()
        missing = sorted(set(saved.get("ready_batches", [])) - set(buffered))
        if missing:
            raise ValueError(f"the experience buffer ({self._buffer_where()}) lacks the batches {missing} that the "
                             f"step-{self.global_steps} checkpoint counts as generated: their prompts would be skipped. "
                             "Fix: resume with the buffer file the run wrote, or start over (trainer.resume_mode=disable "
                             "with a new async_training.buffer.path).")
        streaming = self.config.async_training.partial_rollout  # groups finish out of order: skip each one buffered
        self._buffered_groups = self._group_keys() if streaming else frozenset()
        self._producer_state = ProducerState(
            next_batch=int(saved.get("next_batch", self.global_steps + 1)), loader=self.train_dataloader.state_dict(),
            skip_through=0 if streaming else max([int(saved.get("skip_through", 0))] + buffered))
        self.dropped_total = int(saved.get("dropped_total", 0))
        if released or buffered or self.discarded_newer:
            logger.info("experience buffer: %d rows taken after step %d are ready again; %d rows of newer weights "
                        "discarded; %d rows buffered", released, self.global_steps, self.discarded_newer, len(buffered))

    def _check_resumable(self, saved: dict) -> None:
        """One-line errors for a resume that would skip or repeat prompt batches."""
        a = self.config.async_training
        if self.resumed_state is None:  # a fresh start
            if self.config.trainer.resume_mode == "disable" and self.buffer.count():
                raise ValueError(f"trainer.resume_mode=disable starts over, but {self._buffer_where()} already holds "
                                 f"{self.buffer.count()} experiences of an earlier run. Fix: delete it or set "
                                 "async_training.buffer.path to a new file.")
            return
        if saved.get("storage_type", a.buffer.storage_type) != a.buffer.storage_type:
            raise ValueError(f"the checkpoint was written with async_training.buffer.storage_type="
                             f"{saved['storage_type']} and this run uses {a.buffer.storage_type}. Fix: resume with "
                             f"async_training.buffer.storage_type={saved['storage_type']}.")
        if saved.get("rows_per_batch", self.rows_per_batch) != self.rows_per_batch:
            raise ValueError(f"the checkpoint's batches have {saved['rows_per_batch']} rows and this run's "
                             f"{self.rows_per_batch} (data.train_batch_size x actor_rollout_ref.rollout.n). Fix: "
                             "resume with the batch size and rollout.n of the run that wrote it.")

    def _buffer_where(self) -> str:
        """The buffer as an error message names it; a database URL's password shown as ``***``."""
        from hybrid_rl.utils.redact import redact_url

        b = self.config.async_training.buffer
        if b.storage_type == "memory":
            return "the memory buffer"
        return f"async_training.buffer.path={redact_url(b.path or self.run_dir + '/experiences.db')}"
