"""TrainerCore: the mode-neutral driver every training mode is a sibling on.

It owns what does not depend on what is trained: the config check and run plan, the tokenizer,
datasets and the resumable loader, :meth:`fit` and its batch loop, :meth:`train_step` over the
mode's :meth:`step_plan`, the timing of each named step, the validate/save cadence
(:meth:`cadence_steps`), atomic checkpoints and resume, the health checks, the trackers, the progress
bar and the end-of-run plot. A mode (PPO and its decoupled variant, SFT, reward-model training)
supplies its datasets, its worker groups, its step methods ``step(batch, metrics) -> batch`` with the
batch keys each reads and writes (:meth:`declare_batch_plan`, checked before any worker starts and,
with ``trainer.check_batch``, at every step boundary), its validation and its log line; none of them
subclasses another mode::

    TrainerCore ─┬─ RayPPOTrainer ── DecoupledPPOTrainer
                 ├─ PolicyModeTrainer ─┬─ SFTTrainer     (core/policy_mode.py: the actor-only modes' share)
                 │                     └─ DPOTrainer
                 └─ RMTrainer
"""

from __future__ import annotations

import abc
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
from codetiming import Timer

from hybrid_rl.protocol import DataProto
from hybrid_rl.schema import check_batch
from hybrid_rl.single_controller import WorkerDiedError, WorkerGroupError
from hybrid_rl.trainer.config.loader import to_container
from hybrid_rl.trainer.config.run_checks import RunPlan, run_dir, world_size_problems
from hybrid_rl.trainer.core import inputs, metrics as metric_fns, worker_groups
from hybrid_rl.trainer.core.batch_contract import BatchPlan, check_after, check_batch_enabled, check_before
from hybrid_rl.trainer.core.checkpoints import CheckpointManager, capture_rng_state, restore_rng_state
from hybrid_rl.trainer.core.health import HealthMonitor
from hybrid_rl.trainer.core.plotting import PLOT_FILE, plot_run
from hybrid_rl.trainer.core.runtime_checks import check_run_state
from hybrid_rl.trainer.core.timeline import NULL_TIMELINE, TIMELINE_FILE, Timeline
from hybrid_rl.trainer.core.tracking import ProgressBar, Tracking, as_backend_list
from hybrid_rl.utils import faults
from hybrid_rl.utils.seeding import seed_everything

__all__ = ["TrainerCore", "seed_everything", "timed"]

logger = logging.getLogger(__name__)


@contextmanager
def timed(name: str, timing: dict[str, float],
          record: Optional[Callable[[str, float, float], None]] = None) -> Iterator[None]:
    """Add the seconds the block takes to ``timing[name]``; with ``record``, also call
    ``record(name, start, start + seconds)``, ``start`` the block's wall-clock start (:func:`time.time`)."""
    start = time.time()
    with Timer(name=None, text="", logger=None) as timer:
        yield
    timing[name] = timing.get(name, 0.0) + timer.last
    if record is not None:
        record(name, start, start + timer.last)


class TrainerCore(abc.ABC):
    """The loop, checkpoints, trackers and cadence shared by every mode (see the module docstring).

    A mode implements its config (:meth:`_typed_config`, :meth:`check_config`, :meth:`make_plan`,
    :meth:`_build_tokenizer`, :meth:`_report_precision`), :meth:`_datasets`, :meth:`init_workers`,
    :meth:`step_plan` (its own steps, then :meth:`cadence_steps`), its step methods and their
    :meth:`declare_batch_plan`,
    :meth:`run_validation`, :meth:`log` (ending in :meth:`_publish`) and :meth:`_checkpoint_parts`.
    The core reads only the sections every mode's config has: ``trainer``, ``ray_init`` and ``data``'s
    ``train_batch_size`` / ``shuffle`` / ``seed``.

    Args:
        config: the mode's typed config (a :class:`RunConfig`: PPO's, SFT's, RM's) or a DictConfig
            composed over its schema (:func:`hybrid_rl.trainer.config.loader.get_config`).
        tokenizer: defaults to the model's tokenizer.
        train_dataset / val_dataset: datasets to use instead of the ones the mode builds from ``data.*``.
        worker_classes: worker classes to use instead of the mode's defaults (the mode reads them).
        for_training: false for a trainer that only generates and scores (``eval``, ``debug``): the
            update's batch sizes and the checkpoint to resume from are not checked, no disk probe.
    """

    #: where :meth:`fit` records its spans (``timeline.jsonl`` while fitting with the jsonl logger)
    timeline: Timeline = NULL_TIMELINE

    def __init__(self, config, tokenizer=None, *, train_dataset=None, val_dataset=None,
                 worker_classes: tuple[Optional[type], ...] = (), for_training: bool = True):
        self.config = self._typed_config(config)
        self.check_config(training=for_training)
        # the run folder and the checkpoint a resume would load: read from disk, before any worker starts
        check_run_state(self.config, lambda _, point: self._resume_problems(point), training=for_training)
        cfg = self.config
        self.plan: RunPlan = self.make_plan()
        # what each step reads and writes; a plan whose step needs a key nothing makes stops here, in one line
        self.batch_plan: Optional[BatchPlan] = self.declare_batch_plan()
        if self.batch_plan is not None:
            self.batch_plan.check()
        self.actor_compute_dtype = self._report_precision()
        self.tokenizer = tokenizer if tokenizer is not None else self._build_tokenizer()
        self.train_dataset, self.val_dataset = self._datasets(train_dataset, val_dataset)
        self.train_dataloader = inputs.build_train_dataloader(self.train_dataset, cfg)
        self.total_training_steps = self._count_training_steps()
        self.run_dir = run_dir(cfg)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.trainer.max_actor_ckpt_to_keep)
        if cfg.trainer.save_freq > 0 and for_training:
            self.checkpoints.probe(self._checkpoint_bytes())
        self.health = HealthMonitor.from_config(cfg.trainer)
        self.last_committed_step: Optional[int] = None  # newest checkpoint this trainer committed
        self.global_steps = 0
        self.resumed_state: Optional[dict[str, Any]] = None  # the driver state a resume restored
        self.workers: Optional[worker_groups.WorkerGroups] = None
        self.tracker: Optional[Tracking] = None
        self.progress: Optional[ProgressBar] = None
        self._worker_classes = tuple(worker_classes)
        self._epoch_batches: Optional[Iterator[Any]] = None  # the current epoch of the training stream

    # ------------------------------------------------------------------ what a mode supplies
    @abc.abstractmethod
    def _typed_config(self, config: Any) -> Any:
        """The mode's typed config of ``config`` (interpolations resolved)."""

    @abc.abstractmethod
    def check_config(self, training: bool) -> None:
        """Raise one ValueError listing every problem of ``self.config`` (``training=False``: a run that
        only generates and scores, whose update settings and resume point are not checked)."""

    @abc.abstractmethod
    def make_plan(self) -> RunPlan:
        """The values derived from the checked config (device, workers, which models run)."""

    @abc.abstractmethod
    def _build_tokenizer(self) -> Any:
        """The tokenizer of the model the mode trains."""

    @abc.abstractmethod
    def _report_precision(self) -> str:
        """Log the compute dtypes of the models this run trains; returns the first one's."""

    def _memory_hint(self) -> str:
        """What to lower when a worker died without a traceback (a mode names its own keys)."""
        allocator = "" if self.config.trainer.cpu_allocator != "glibc" else " or trainer.cpu_allocator=auto (jemalloc)"
        return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower the batch or "
                f"the lengths{allocator}; each run logs perf/peak_rss_gib/<step>.")

    def _resume_problems(self, point: Any) -> list[str]:
        """Why the checkpoint ``point`` cannot be loaded by this run (a mode adds its own reasons)."""
        return world_size_problems(self.config, point)

    @abc.abstractmethod
    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """``(train, val)``: the given datasets, else the mode's from ``data.*`` (val may be None)."""

    @abc.abstractmethod
    def _checkpoint_bytes(self) -> int:
        """Estimated size of one checkpoint, for the disk-space probe."""

    @abc.abstractmethod
    def init_workers(self) -> None:
        """Start the mode's worker groups and load the models."""

    @abc.abstractmethod
    def step_plan(self) -> list[str]:
        """Names of the step methods run at ``self.global_steps``, in order: the mode's own steps, then
        :meth:`cadence_steps`."""

    def declare_batch_plan(self) -> Optional[BatchPlan]:
        """The batch keys the dataset gives and each step of :meth:`step_plan` reads and writes, checked
        at start-up and, with ``trainer.check_batch``, at every step boundary
        (:mod:`~hybrid_rl.trainer.core.batch_contract`). Called by the core's constructor after
        :meth:`make_plan`. None (the default): the mode declares nothing and nothing is checked."""
        return None

    @abc.abstractmethod
    def run_validation(self) -> dict[str, float]:
        """The held-out metrics of the current model ({} when there is nothing to validate on)."""

    @abc.abstractmethod
    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """Add the mode's batch and timing metrics, then :meth:`_publish`."""

    @abc.abstractmethod
    def _checkpoint_parts(self) -> list[tuple[str, Any]]:
        """``(sub-folder of global_step_N, worker group)`` of every model a checkpoint holds."""

    def _driver_state(self) -> dict[str, Any]:
        """What the driver saves beside the models (a mode adds its own entries)."""
        return {
            "dataloader": self.train_dataloader.state_dict(),
            "rng": capture_rng_state(),
            "world_size": self.plan.world_size,
            "total_training_steps": self.total_training_steps,
            "health": self.health.state_dict(),
        }

    def _load_driver_state(self, state: dict[str, Any]) -> None:
        """Restore the mode's own entries of :meth:`_driver_state` after a resume (none here)."""

    def on_step_end(self, metrics: dict[str, float]) -> None:
        """Hook called after each logged step and the built-in health checks (early stopping, ...);
        no-op here."""

    # ------------------------------------------------------------------ the loop
    def _count_training_steps(self) -> int:
        per_epoch = len(self.train_dataloader)
        by_epochs = per_epoch * self.config.trainer.total_epochs
        requested = self.config.trainer.total_training_steps
        return min(requested, by_epochs) if requested is not None else by_epochs

    def shutdown(self) -> None:
        """Stop the workers and release their devices."""
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None

    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        if self.workers is None:
            self.init_workers()
        last: dict[str, float] = self._begin_fit()
        try:
            for batch in self._batches():
                self.global_steps += 1
                last = self.train_step(batch)
                self.health.observe(last, self.global_steps)
                self.on_step_end(last)
        finally:
            self._end_fit()
        return last

    def _batches(self) -> Iterator[DataProto]:
        """Batches until the last step, cycling epochs (the loader resumes mid-epoch)."""
        while self.global_steps < self.total_training_steps:
            yield self.next_prompt_batch()

    def next_prompt_batch(self) -> DataProto:
        """The next batch of the training stream, a new epoch starting when one ends. The loop takes one
        per step; a step may take more (DAPO's dynamic sampling): the loader's saved position counts
        every batch handed out, so a resumed run continues exactly."""
        while True:
            if self._epoch_batches is None:
                self._epoch_batches = iter(self.train_dataloader)
            # torch's DataLoader draws a base seed from the global RNG when an epoch starts; a
            # resumed run starts its epoch at another point, so keep the loader off that RNG.
            with torch.random.fork_rng(devices=[]):
                batch_dict = next(self._epoch_batches, None)
            if batch_dict is not None:
                return DataProto.from_single_dict(batch_dict)
            self._epoch_batches = None

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """Run :meth:`step_plan` on one batch, then :meth:`log`; returns the step's metrics."""
        metrics: dict[str, Any] = {}
        timing: dict[str, float] = {}
        plan = self.batch_plan if check_batch_enabled(self.config.trainer.check_batch) else None
        self.timeline.step = self.global_steps
        record = self._trainer_span if self.timeline.enabled else None
        with timed("step", timing, record):
            if plan is not None:
                check_batch(batch, plan.inputs.writes, step=plan.inputs.name)
            for name in self.step_plan():
                faults.inject(f"driver.{name}", self.global_steps)  # no-op unless HYBRID_RL_FAULT (tests)
                if plan is not None:
                    check_before(plan, name, batch)
                with timed(name, timing, record):
                    batch = self._run_step(name, batch, metrics)
                if plan is not None:
                    check_after(plan, name, batch)
        return self.log(batch, metrics, timing)

    def _trainer_span(self, name: str, start: float, end: float) -> None:
        """A named step's span on the trainer's lane of the timeline."""
        self.timeline.record("trainer", name, start, end)

    def _run_step(self, name: str, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        try:
            return getattr(self, name)(batch, metrics)
        except WorkerGroupError as error:
            # Which worker and call the group error names; which training step only the driver knows.
            hint = self._memory_hint() if isinstance(error, WorkerDiedError) else ""
            raise type(error)(f"training step {self.global_steps}, `{name}`: {error}{hint}") from error

    # ------------------------------------------------------------------ cadence
    def cadence_steps(self) -> list[str]:
        """``validate`` and ``save_checkpoint`` when due at this step: the tail of every step plan."""
        return (["validate"] if self._validation_due() else []) + (["save_checkpoint"] if self._save_due() else [])

    def _is_last_step(self) -> bool:
        return self.global_steps >= self.total_training_steps

    def _has_validation_data(self) -> bool:
        """Whether there is anything to validate on (a mode may have more than ``val_dataset``)."""
        return self.val_dataset is not None

    def _validation_due(self) -> bool:
        t = self.config.trainer
        if not self._has_validation_data():
            return False
        return (t.test_freq > 0 and self.global_steps % t.test_freq == 0) or (self._is_last_step() and t.val_at_end)

    def _save_due(self) -> bool:
        t = self.config.trainer
        return t.save_freq > 0 and (self.global_steps % t.save_freq == 0 or self._is_last_step())

    def _update(self, call: Any, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """One worker update ``call(batch)`` at this step (the step number rides in ``meta_info``);
        its reduced metrics go into ``metrics``."""
        batch.meta_info["global_steps"] = self.global_steps
        output = call(batch)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return batch

    @staticmethod
    def _absorb(batch: DataProto, output: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Copy a worker output's tensors into ``batch`` and its reduced worker metrics into ``metrics``."""
        for key in output.batch.keys() if output.batch is not None else []:
            batch.batch[key] = output.batch[key]
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return batch

    def validate(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        metrics.update(self.run_validation())
        return batch

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Workers write their models, then the driver state marks the step complete (atomically)."""
        step = self.global_steps
        try:
            self.checkpoints.begin(step)
            for name, group in self._checkpoint_parts():
                group.save_checkpoint(os.path.join(self.checkpoints.step_dir(step), name), global_step=step)
            faults.inject("driver.commit", step)  # no-op unless HYBRID_RL_FAULT (tests)
            self.checkpoints.commit(step, self._driver_state())
        except OSError as error:  # disk full, permissions (a worker's OSError arrives as one too)
            raise self.checkpoints.abort(step, error) from error
        self.last_committed_step = step
        return batch

    def load_checkpoint(self) -> None:
        """Resume per ``trainer.resume_mode`` (auto: latest complete checkpoint, if any)."""
        t = self.config.trainer
        point = self.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path)
        if point is None:
            return
        # Checked before Ray started too; the point may be newer now (auto resume, a restart).
        problems = self._resume_problems(point)
        if problems:
            raise ValueError(" ".join(problems))
        for name, group in self._checkpoint_parts():
            group.load_checkpoint(os.path.join(point.step_dir, name))
        self.train_dataloader.load_state_dict(point.state["dataloader"])
        self._epoch_batches = None  # continue from the restored position
        restore_rng_state(point.state["rng"])
        self.health.load_state_dict(point.state.get("health"))
        self.global_steps = point.global_step
        self.resumed_state = point.state
        self._load_driver_state(point.state)
        logger.info("Resumed from %s (step %d)", point.step_dir, self.global_steps)

    # ------------------------------------------------------------------ start, end, trackers
    def _begin_fit(self) -> dict[str, float]:
        t = self.config.trainer
        os.makedirs(self.run_dir, exist_ok=True)
        self.tracker = Tracking(t.project_name, t.experiment_name, as_backend_list(t.logger), self.run_dir,
                                config=to_container(self.config))
        # the step timeline beside metrics.jsonl, with the jsonl logger (docs/observability.md, "Step timeline")
        self.timeline = Timeline(os.path.join(self.run_dir, TIMELINE_FILE)
                                 if "jsonl" in as_backend_list(t.logger) else None)
        # Seed the driver's RNGs like a fresh process; a resumed run then restores the saved state.
        seed_everything(t.seed)
        self.load_checkpoint()
        self.timeline.step = self.global_steps  # a resumed run's producer spans before its first step
        metrics: dict[str, float] = {}
        if t.val_before_train and self.global_steps == 0 and self._has_validation_data():
            timing: dict[str, float] = {}
            with timed("validate", timing, self._trainer_span):
                metrics = self.run_validation()
            metrics["timing_s/validate"] = timing["validate"]
            self.tracker.log(metrics, step=0)
        if self.batch_plan is not None and check_batch_enabled(t.check_batch):
            logger.info("trainer.check_batch: the batch is checked at every step boundary against %s",
                        self.batch_plan.owner)
        self.progress = ProgressBar(self.total_training_steps, self.global_steps, enabled=t.progress_bar)
        return metrics

    def _end_fit(self) -> None:
        self.timeline.close()
        self.timeline = NULL_TIMELINE
        if self.progress is not None:
            self.progress.close()
        if self.tracker is not None:
            self.tracker.finish()
            if self.config.trainer.plot:
                plot_run(self.tracker.jsonl_path, os.path.join(self.run_dir, PLOT_FILE),
                         title=f"{self.config.trainer.project_name}/{self.config.trainer.experiment_name}")

    def _publish(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Stamp the step and epoch, send ``metrics`` to the trackers and the progress bar."""
        metrics["training/global_step"] = self.global_steps
        metrics["training/total_steps"] = self.total_training_steps  # for progress readers (the studio)
        metrics["training/epoch"] = self.train_dataloader.epoch
        self.tracker.log(metrics, step=self.global_steps)
        self.progress.update(metrics)
        return metrics
