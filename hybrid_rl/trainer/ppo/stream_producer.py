"""The decoupled mode's streaming producer: per-group streaming with partial rollout
(``async_training.partial_rollout=true``).

Where :class:`~hybrid_rl.trainer.ppo.producer.RolloutProducer` generates a whole prompt batch per engine call
(the batch waits for its longest response, a weight update waits for the batch), this producer keeps the
rollout engines busy with **groups** (one prompt's ``rollout.n`` rows):

* the **generation stage** draws prompt batches from the train loader, cuts each into its groups and submits
  a group's requests to the engines whenever the capacity allows; it then pumps the engines
  (``step(max_wall_s)``), collecting every sample as it finishes. A group whose n samples are done goes to the
  reward stage at once;
* offered weights are loaded **between two pumps without waiting for the in-flight samples**: the engines
  interrupt them at the current token, load, and continue from the tokens already sampled (partial rollout).
  Each response token carries the version of the weights that sampled it (``rollout_versions``) and its
  behaviour log-prob; a row's ``policy_version`` in the buffer is its group's oldest token's version, so the
  staleness rule covers the oldest token of every row and drops or trains a group whole;
* the **reward stage** scores groups concurrently and puts each into the buffer as soon as it is scored.

Capacity (AReaL's rule, counted per group): a new group may start only while
``taken + ready + running < (eta + rollout_version + 1) * groups_per_batch``.

Resume: a checkpoint records the first prompt batch with a group not yet in the buffer (and the loader before
it); a resumed run draws from there and skips every group already in the buffer (``rollout_batch`` and
``rollout_group`` of its rows), so nothing is lost or generated twice. Partial samples in flight when the run
died are generated again from their prompt.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hybrid_rl.buffer import Experience, experiences_from_batch
from hybrid_rl.protocol import DataProto
from hybrid_rl.protocol_utils import to_object_array
from hybrid_rl.trainer.core.timeline import SpanRun
from hybrid_rl.trainer.ppo.producer import ProducerState, RolloutProducer, _Generated
from hybrid_rl.trainer.ppo.stream_groups import StreamGroup, group_requests, parse_request_id

__all__ = ["StreamingProducer", "group_versions", "may_start_group"]

logger = logging.getLogger(__name__)


def may_start_group(taken: int, ready: int, running: int, rollout_version: Optional[int], eta: int,
                    groups_per_batch: int) -> bool:
    """AReaL's capacity counted in groups: True when one more group can start without any of its rows
    ending up more than ``eta`` versions older than the trainer step that uses it (no weights yet: False)."""
    if rollout_version is None:
        return False
    return taken + ready + running < (eta + rollout_version + 1) * groups_per_batch


@dataclass
class _GroupGenerated(_Generated):
    position: int = 0
    """The group's position in its prompt batch."""


class StreamingProducer(RolloutProducer):
    """Fills the buffer group by group, with partial rollout (module docstring).

    Args (beyond :class:`RolloutProducer`'s, whose ``generate`` is not used):
        split: ``split(batch_dict, index) -> list[StreamGroup]`` prepares prompt batch ``index``'s groups.
        submit: ``submit(requests)`` hands stream requests (plain dicts) to the engines.
        step: ``step(max_wall_s) -> list[dict]`` pumps the engines; the samples that finished.
        assemble: ``assemble(group) -> DataProto`` the group's rollout batch from its samples.
        load_weights: ``load_weights(weights, version) -> metrics`` (interrupts and resumes in-flight requests).
        groups_per_batch: prompts per batch (``data.train_batch_size``).
        buffered_groups: ``(batch, position)`` of the groups already in the buffer (a resumed run skips them).
        ready_groups: groups waiting in the buffer at start (default: ``ready_batches`` whole batches).
        step_wall_s: the longest one pump may run before the stage looks at weights, jobs and capacity again.
    """

    def __init__(self, *, split: Callable, submit: Callable, step: Callable, assemble: Callable,
                 groups_per_batch: int, buffered_groups: frozenset = frozenset(), ready_groups: Optional[int] = None,
                 step_wall_s: float = 0.25, **kwargs: Any):
        kwargs.setdefault("generate", None)
        super().__init__(**kwargs)
        self._split, self._submit, self._step, self._assemble = split, submit, step, assemble
        self.groups_per_batch = groups_per_batch
        self.step_wall_s = step_wall_s
        self._taken *= groups_per_batch  # the trainer's counts arrive in batches; this producer counts groups
        self._ready = self._ready * groups_per_batch if ready_groups is None else ready_groups
        self._buffered = set(buffered_groups)
        self._queue: list[StreamGroup] = []  # drawn, not yet submitted
        self._groups: dict[tuple[int, int], StreamGroup] = {}  # submitted, not yet complete
        self._open: dict[int, int] = {}  # batch index -> its groups not yet in the buffer
        self._submitted_at: dict[tuple[int, int], float] = {}
        self.max_tokens = 0
        """Response budget of each request (``rollout.response_length``; set by the trainer)."""
        self.agent_rows = False
        """Rows run through agent loops: requests carry their non-tensor columns (set by the trainer)."""

    # ------------------------------------------------------------------ trainer side
    def consumed(self, batches: int) -> None:
        with self._lock:
            self._taken += batches * self.groups_per_batch
            self._ready -= batches * self.groups_per_batch
            self._lock.notify_all()

    def dropped_rows(self, rows: int, rows_per_group: int) -> None:
        """``rows`` rows were dropped as stale (whole groups: they no longer count as ready)."""
        with self._lock:
            self._ready -= -(-rows // rows_per_group)
            self._lock.notify_all()

    def stalled(self) -> bool:
        with self._lock:
            return (self._threads != [] and self._running == 0 and not self._queue and self._pending is None
                    and not self._loading and self._version is not None and not self._can_start())

    def _can_start(self) -> bool:
        return may_start_group(self._taken, self._ready, self._running, self._version, self.eta,
                               self.groups_per_batch)

    # ------------------------------------------------------------------ the generation stage
    def _load(self, weights: Any, version: int) -> dict:
        return self._load_weights(weights, version)  # the engines interrupt and resume what is in flight

    def _draw_groups(self) -> None:
        """Draw the next prompt batch into the submit queue (groups already buffered are skipped)."""
        before, batch_dict = next(self._batches)
        with self._lock:
            index = self._next_index
            self._next_index += 1
            self._loader_state = self.loader.state_dict()
        groups = [g for g in self._split(batch_dict, index) if g.key not in self._buffered]
        with self._lock:
            if groups:
                self._inflight[index] = before
                self._open[index] = len(groups)
            self._queue.extend(groups)

    def _submit_ready_groups(self) -> None:
        """Submit queued groups (drawing batches as needed) while the capacity allows."""
        requests: list[dict] = []
        while not self._stop.is_set():
            with self._lock:
                if not self._can_start():
                    break
            if not self._queue:
                self._draw_groups()
                continue
            with self._lock:
                group = self._queue.pop(0)
                self._running += 1
                self._groups[group.key] = group
                self._submitted_at[group.key] = time.perf_counter()
            requests.extend(group_requests(group, self.max_tokens, self.agent_rows))
        if requests:
            self._submit(requests)

    def _generation_loop(self) -> None:
        """Pump the engines while groups are in flight; the timeline's ``generate`` span is a run of
        pumps (with the assembly of the groups they finished), ``wait_capacity`` a run of idle waits
        (nothing in flight, no room for a group)."""
        start_idle = time.perf_counter()
        pumping = SpanRun(self.timeline, "rollout", "generate")
        waiting = SpanRun(self.timeline, "rollout", "wait_capacity")
        try:
            while not self._stop.is_set():
                if self._jobs or self._pending:  # a job or a load comes next: the runs before it end
                    pumping.flush()
                    waiting.flush()
                self._run_jobs()
                self._apply_pending()
                self._submit_ready_groups()
                with self._lock:
                    busy = bool(self._groups)
                    idle = not busy and not (self._jobs or self._pending)
                    began = time.time()
                    if idle:
                        self._lock.wait(0.1)
                if idle:  # the file is written outside the lock
                    pumping.flush()
                    waiting.add(began, time.time())
                if not busy:
                    continue
                waiting.flush()
                with self._lock:
                    self._idle_s += time.perf_counter() - start_idle
                began = time.time()
                finished = self._step(self.step_wall_s)
                start_idle = time.perf_counter()
                self._collect(finished)
                pumping.add(began, time.time())  # the pump and the assembly of the groups it finished
        finally:
            pumping.flush()
            waiting.flush()

    def _collect(self, finished: list[dict]) -> None:
        """File each finished sample under its group; hand complete groups to the reward stage."""
        for sample in finished:
            batch, position, row = parse_request_id(sample["request_id"])
            group = self._groups.get((batch, position))
            if group is None:  # a sample of a group this run no longer tracks (never expected)
                logger.warning("stream sample %s of no tracked group dropped", sample["request_id"])
                continue
            group.samples[row] = sample
            if group.complete:
                del self._groups[group.key]
                with self._lock:
                    metrics, self._load_metrics = dict(self._load_metrics), {}
                metrics["timing_s/rollout_generate"] = time.perf_counter() - self._submitted_at.pop(group.key)
                first = min(v for s in group.samples.values() for v in (s["versions"][:1] or [self._version]))
                self._hand_to_reward(_GroupGenerated(batch, first, self._assemble(group), metrics, position=position))

    # ------------------------------------------------------------------ the reward stage
    def _reward_workers(self) -> int:
        return (self.eta + 1) * self.groups_per_batch  # groups of eta + 1 batches scored at once

    def _scored_ones(self, pending: deque) -> list[tuple[_Generated, Future]]:
        """Each group as soon as it is scored (groups finish out of order anyway)."""
        done = [p for p in pending if p[1].done()]
        for item in done:
            pending.remove(item)
        return done

    def _put(self, item: _GroupGenerated, batch: DataProto) -> None:
        position = item.position
        batch.non_tensor_batch["rollout_batch"] = to_object_array([item.index] * len(batch))
        batch.non_tensor_batch["rollout_group"] = to_object_array([position] * len(batch))
        experiences = group_versions(experiences_from_batch(batch, self.tokenizer, policy_version=item.version))
        with self._lock:
            if self._stop.is_set():
                return
            self.buffer.put(experiences)
            self._buffered.add((item.index, position))
            self._open[item.index] -= 1
            if self._open[item.index] == 0:
                del self._open[item.index]
                self._inflight.pop(item.index, None)
            self._running -= 1
            self._ready += 1
            self._metrics[(item.index, position)] = item.metrics
            self._lock.notify_all()

    def _pop_records(self, indices: set[int]) -> list[dict]:
        """The metric records of the groups of the given prompt batches (removed), older ones dropped."""
        records = [self._metrics.pop(k) for k in sorted(k for k in self._metrics if k[0] in indices)]
        for older in [k for k in self._metrics if indices and k[0] < min(indices)]:
            del self._metrics[older]
        return records


def group_versions(experiences: list[Experience]) -> list[Experience]:
    """Give every row of a group the group's oldest version as ``policy_version`` (each row's own token
    versions kept: stored explicitly where they no longer equal it), so the staleness rule drops or trains
    a group whole: GRPO's advantages need all n rows of a prompt, and rows of one group may start under
    different weights when a push lands between their first tokens."""
    oldest = min(e.policy_version for e in experiences)
    for e in experiences:
        if e.policy_version != oldest and e.token_versions is None:
            e.token_versions = [e.policy_version if m else -1 for m in e.response_mask]
        e.policy_version = oldest
    return experiences


def _by_group(requests: list[dict], world_size: int) -> list[list[dict]]:
    """Each rank's share: a group's rows stay on one rank (their prompt's prefix is cached once)."""
    shares: list[list[dict]] = [[] for _ in range(world_size)]
    for request in requests:
        batch, position, _ = parse_request_id(request["request_id"])
        shares[(batch * 7919 + position) % world_size].append(request)
    return shares


def streaming_producer(trainer: Any, common: dict) -> StreamingProducer:
    """The :class:`StreamingProducer` of a ``DecoupledPPOTrainer`` (its rollout pool, config and scorer);
    ``common``: the arguments both producers take."""
    from hybrid_rl.agents.config import agent_rollout_enabled
    from hybrid_rl.trainer.core import generation
    from hybrid_rl.trainer.ppo.stream_groups import assemble_group, split_groups
    from hybrid_rl.workers.rollout.params import resolve_generation_params

    rollout_cfg = trainer.config.actor_rollout_ref.rollout
    pool = trainer.workers.rollout
    meta = trainer._generation_meta(validate=False, step=0)
    meta.pop("seed")  # one continuous private stream per engine: a streamed request has no per-call seed
    params = resolve_generation_params(rollout_cfg, meta, trainer.tokenizer)

    def split(batch_dict: dict, index: int) -> list[StreamGroup]:
        prepared = generation.prepare_rollout_batch(DataProto.from_single_dict(batch_dict), rollout_cfg.n, index)
        return split_groups(prepared, rollout_cfg.n, index)

    def load(weights: Any, version: int) -> dict[str, float]:
        try:
            outputs = pool.stream_load_weights(weights, version)
        finally:  # the push's buckets (and older unloaded ones) are freed once loaded
            if getattr(trainer, "weight_pushes", None) is not None:
                trainer.weight_pushes.loaded(weights)
        return {"timing_s/weight_load": max(o["timing_s/weight_load"] for o in outputs),
                "async/interrupted_requests": float(sum(o["rollout/requests_in_flight_at_load"] for o in outputs))}

    producer = StreamingProducer(
        split=split, submit=lambda requests: pool.stream_submit(_by_group(requests, pool.world_size),
                                                                [meta] * pool.world_size),
        step=lambda wall_s: [sample for rank in pool.stream_step(wall_s) for sample in rank],
        assemble=lambda group: assemble_group(group, params, rollout_cfg.calculate_log_probs),
        load_weights=load, groups_per_batch=trainer.config.data.train_batch_size,
        buffered_groups=trainer._buffered_groups, ready_groups=trainer.buffer.count("ready") // rollout_cfg.n,
        **common)
    producer.max_tokens = rollout_cfg.response_length
    producer.agent_rows = agent_rollout_enabled(rollout_cfg)
    return producer
