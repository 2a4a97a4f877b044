"""The decoupled mode's rollout side: a producer that keeps the experience buffer filled.

Two driver threads (the single controller still owns every worker call):

* the **generation stage** draws prompt batches from the train loader, generates them on the rollout
  pool with the weights it holds, and tags them with that weights' version;
* the **reward stage** scores generated batches, up to ``max_head_offpolicyness + 1`` at once (a
  slow reward or service overlaps itself, the next generation and training), and ``put``s their
  rows into the buffer as experiences, in batch order.

Staleness control (AReaL's capacity rule, in batches): a new batch may start only while
``taken + ready + running < max_head_offpolicyness + rollout_version + 1``, where ``taken`` counts the
batches the trainer has consumed, ``ready`` those waiting in the buffer and ``running`` those being
generated or scored. A batch started under that rule is trained at a step whose weights are at most
``max_head_offpolicyness`` versions newer than the ones that sampled it. Weights offered by the
trainer (``offer_weights``) are loaded between two generations, so generation stops only for the copy.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional


from hybrid_rl.buffer import ExperienceBuffer, experiences_from_batch
from hybrid_rl.protocol import DataProto
from hybrid_rl.protocol_utils import to_object_array
from hybrid_rl.single_controller import WorkerGroupError
from hybrid_rl.trainer.core.timeline import NULL_TIMELINE, SpanRun, Timeline, thread_lane

__all__ = ["ProducerState", "RolloutProducer", "may_start_batch"]

logger = logging.getLogger(__name__)

_POLL_S = 0.02


def may_start_batch(taken: int, ready: int, running: int, rollout_version: Optional[int], eta: int) -> bool:
    """AReaL's staleness capacity in batches: True when one more batch can start without any sample
    ending up more than ``eta`` versions older than the trainer that uses it (no weights yet: False)."""
    if rollout_version is None:
        return False
    return taken + ready + running < eta + rollout_version + 1


@dataclass
class ProducerState:
    """Where the producer resumes: the first batch not yet in the buffer and the loader before it."""

    next_batch: int
    """Index (1-based, one per prompt batch drawn) of the first batch not written to the buffer."""
    loader: dict
    """The train loader's ``state_dict()`` just before drawing ``next_batch``."""
    skip_through: int = 0
    """Batches with an index up to this are already in the buffer (a persistent buffer written past
    the checkpoint): drawn and skipped, never generated twice."""


@dataclass
class _Generated:
    index: int
    version: int
    batch: DataProto
    metrics: dict = field(default_factory=dict)


class RolloutProducer:
    """Fills ``buffer`` from the rollout pool until :meth:`stop` (see the module docstring).

    Args:
        loader: the train loader (the producer owns it while running).
        state: where to start (:class:`ProducerState`).
        generate: ``generate(prompt_batch, index, metrics) -> DataProto`` on the rollout pool.
        score: ``score(batch, metrics) -> DataProto`` adding ``token_level_scores`` (the reward manager).
        load_weights: ``load_weights(ref) -> metrics`` loads exported weights into the rollout pool.
        buffer / tokenizer: where experiences go and how their text is decoded.
        eta: ``max_head_offpolicyness``.
        taken_batches / ready_batches: the trainer's consumed batches and the buffer's ready ones at start.
        timeline: where the stages record their spans (lanes ``rollout`` and ``reward/<i>``;
            :mod:`hybrid_rl.trainer.core.timeline`); default: nowhere.
    """

    def __init__(self, *, loader: Any, state: ProducerState, generate: Callable, score: Callable,
                 load_weights: Callable, buffer: ExperienceBuffer, tokenizer: Any, eta: int,
                 taken_batches: int, ready_batches: int, timeline: Timeline = NULL_TIMELINE):
        self.loader, self.buffer, self.tokenizer = loader, buffer, tokenizer
        self.timeline = timeline
        self._generate, self._score, self._load_weights = generate, score, load_weights
        self.eta = eta
        self._lock = threading.Condition()
        self._next_index = state.next_batch  # next batch to draw
        self._skip_through = state.skip_through
        self._inflight: dict[int, dict] = {}  # drawn, not yet in the buffer -> loader state before it
        self._loader_state = dict(state.loader)
        self._taken, self._ready, self._running = taken_batches, ready_batches, 0
        self._version: Optional[int] = None  # the weights the rollout pool holds
        self._pending: Optional[tuple[Any, int]] = None  # (exported weights ref/future, version)
        self._loading = False  # offered weights are being loaded (the version is about to change)
        self._jobs: list[tuple[Callable[[], Any], "queue.Queue", str]] = []
        self._metrics: dict[int, dict] = {}  # batch index -> its generation and reward metrics
        self._idle_s = 0.0
        self._load_metrics: dict[str, float] = {}  # of the last weight load, reported with the next batch
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._scored: "queue.Queue[Optional[_Generated]]" = queue.Queue(maxsize=1)
        self._threads: list[threading.Thread] = []
        self._batches = self._prompt_batches()

    # ------------------------------------------------------------------ trainer side
    def start(self) -> None:
        for target, name in ((self._generation_loop, "hybrid_rl-rollout-gen"),
                             (self._reward_loop, "hybrid_rl-rollout-reward")):
            thread = threading.Thread(target=self._guarded, args=(target,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop both stages (a generation in flight is abandoned; its rows never reach the buffer)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)

    def check(self) -> None:
        """Re-raise a failure of either stage in the caller (the trainer); a dead or silent rollout
        worker keeps its ``WorkerGroupError`` type, so ``trainer.max_restarts`` restarts the run."""
        error = self._error
        if error is None:
            return
        if isinstance(error, WorkerGroupError):
            raise type(error)(f"the rollout producer: {error}") from error
        raise RuntimeError(f"the rollout producer failed: {error}") from error

    def offer_weights(self, weights: Any, version: int) -> None:
        """Exported weights of ``version``, loaded before the next generation (a newer offer replaces
        an older one not loaded yet)."""
        with self._lock:
            self._pending = (weights, version)
            self._lock.notify_all()

    def call(self, job: Callable[[], Any], name: str = "job") -> Any:
        """Run ``job`` in the generation stage between two generations (after loading offered
        weights) and return its result; inline when the producer is not running. ``name``: the job's
        span on the timeline's ``rollout`` lane."""
        if not self._threads or self._stop.is_set():  # not running (or stopped): run it here
            self.check()
            self._apply_pending()
            return job()
        answer: "queue.Queue" = queue.Queue(maxsize=1)
        with self._lock:
            self._jobs.append((job, answer, name))
            self._lock.notify_all()
        while True:
            self.check()
            try:
                ok, value = answer.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set() and not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("the rollout producer stopped before it ran the job") from None
                continue
            if ok:
                return value
            raise value

    def consumed(self, batches: int) -> None:
        """The trainer took ``batches`` batches' rows from the buffer."""
        with self._lock:
            self._taken += batches
            self._ready -= batches
            self._lock.notify_all()

    def dropped(self, batches: int) -> None:
        """``batches`` batches' rows were dropped as stale (they no longer count as ready)."""
        with self._lock:
            self._ready -= batches
            self._lock.notify_all()

    def pop_metrics(self, indices: set[int]) -> dict[str, float]:
        """Mean metrics of the given batches' generation and scoring, plus ``timing_s/rollout_idle``
        (seconds the generation stage waited for capacity or weights since the last call)."""
        with self._lock:
            records = self._pop_records(indices)
            idle, self._idle_s = self._idle_s, 0.0
        out: dict[str, float] = {"timing_s/rollout_idle": idle}
        for key in {k for r in records for k in r}:
            values = [r[key] for r in records if key in r]
            out[key] = float(sum(values) / len(values))
        return out

    def _pop_records(self, indices: set[int]) -> list[dict]:
        """The metric records of the given batches (removed), and those of older (dropped) batches dropped."""
        records = [self._metrics.pop(i) for i in sorted(indices) if i in self._metrics]
        for older in [i for i in self._metrics if indices and i < min(indices)]:
            del self._metrics[older]
        return records

    def state(self) -> ProducerState:
        """Where a resumed run continues (consistent with the buffer's contents at this instant)."""
        with self._lock:
            if self._inflight:
                first = min(self._inflight)
                return ProducerState(first, dict(self._inflight[first]), self._skip_through)
            return ProducerState(self._next_index, dict(self._loader_state), self._skip_through)

    @property
    def error(self) -> Optional[BaseException]:
        """The failure that stopped a stage, if any."""
        return self._error

    def stalled(self) -> bool:
        """True while the generation stage waits for capacity with nothing in flight and no weights
        to load: only the trainer taking rows can unblock it."""
        with self._lock:
            return (self._threads != [] and self._running == 0 and self._pending is None and not self._loading
                    and self._version is not None
                    and not may_start_batch(self._taken, self._ready, self._running, self._version, self.eta))

    @property
    def rollout_version(self) -> Optional[int]:
        """The version of the weights the rollout pool holds (None before the first load)."""
        return self._version

    def locked(self) -> threading.Condition:
        """``with producer.locked():`` no batch reaches the buffer meanwhile (consistent snapshots)."""
        return self._lock

    # ------------------------------------------------------------------ the stages
    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - handed to the trainer thread by check()
            if not self._stop.is_set():
                logger.error("rollout producer stage failed: %r", error)
                self._error = error
            self._stop.set()
            with self._lock:
                self._lock.notify_all()

    def _prompt_batches(self) -> Iterator[tuple[int, dict, dict]]:
        """``(index, loader state before it, batch dict)`` forever, cycling epochs."""
        while True:
            batches = iter(self.loader)
            while True:
                before = self.loader.state_dict()
                batch_dict = next(batches, None)  # the loader has its own generator: no global RNG
                if batch_dict is None:
                    break
                yield before, batch_dict

    def _draw(self) -> tuple[int, dict]:
        """The next batch to generate (skipping those already in a persistent buffer)."""
        while True:
            before, batch_dict = next(self._batches)
            with self._lock:
                index = self._next_index
                self._next_index += 1
                self._loader_state = self.loader.state_dict()
                if index > self._skip_through:
                    self._inflight[index] = before
                    self._running += 1
                    return index, batch_dict

    def _wait_for_turn(self) -> bool:
        """Run jobs and load offered weights until a new batch may start; False when stopping."""
        start = time.perf_counter()
        waiting = SpanRun(self.timeline, "rollout", "wait_capacity")
        try:
            while not self._stop.is_set():
                ran, loaded = self._run_jobs(), self._apply_pending()
                if ran or loaded:
                    waiting.flush()  # a job or a load ran: the wait before it ends there
                with self._lock:
                    if may_start_batch(self._taken, self._ready, self._running, self._version, self.eta):
                        self._idle_s += time.perf_counter() - start
                        return True
                    began, waited = time.time(), not (self._jobs or self._pending)
                    if waited:
                        self._lock.wait(_POLL_S * 5)
                if waited:  # the file is written outside the lock
                    waiting.add(began, time.time())
            return False
        finally:
            waiting.flush()

    def _run_jobs(self) -> bool:
        """Run the trainer's queued jobs (validation); whether there was any."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job, answer, name in jobs:
            self._apply_pending()
            try:
                with self.timeline.span("rollout", name):
                    result = job()
                answer.put((True, result))
            except Exception as error:  # noqa: BLE001 - re-raised in the caller
                answer.put((False, error))
        return bool(jobs)

    def _apply_pending(self) -> bool:
        """Load the offered weights, if any; whether there were."""
        with self._lock:
            pending, self._pending = self._pending, None
            self._loading = pending is not None
        if pending is None:
            return False
        weights, version = pending
        try:
            with self.timeline.span("rollout", "load_weights", version=version):
                metrics = self._load(weights, version)
        except BaseException:
            with self._lock:
                self._loading = False
            raise
        with self._lock:  # one step: never 'not loading' with the old version
            self._loading = False
            self._version = version
            self._load_metrics = dict(metrics or {})
        return True

    def _load(self, weights: Any, version: int) -> dict:
        """Load offered weights into the rollout pool (the streaming producer also passes the version)."""
        return self._load_weights(weights)

    def _generation_loop(self) -> None:
        while self._wait_for_turn():
            index, batch_dict = self._draw()
            with self._lock:
                metrics, self._load_metrics = dict(self._load_metrics), {}
            version = self._version
            start, wall_start = time.perf_counter(), time.time()
            batch = self._generate(DataProto.from_single_dict(batch_dict), index, metrics)
            metrics["timing_s/rollout_generate"] = time.perf_counter() - start
            self.timeline.record("rollout", "generate", wall_start, wall_start + metrics["timing_s/rollout_generate"],
                                 batch=index)
            self._hand_to_reward(_Generated(index, version, batch, metrics))

    def _hand_to_reward(self, item: _Generated) -> None:
        """Queue a generated item for the reward stage; the time it waits for room is ``wait_reward``."""
        began = time.time()
        waited = False
        while not self._stop.is_set():
            try:
                self._scored.put(item, timeout=0.1)
                break
            except queue.Full:
                waited = True
        if waited:
            self.timeline.record("rollout", "wait_reward", began, time.time())

    def _reward_loop(self) -> None:
        """Score up to eta + 1 batches at once (a latency-bound reward or service overlaps itself
        as well as generation and training); put them into the buffer in batch order."""
        pending: deque[tuple[_Generated, Future]] = deque()
        pool = ThreadPoolExecutor(max_workers=self._reward_workers(), thread_name_prefix="hybrid_rl-reward")
        try:
            while not self._stop.is_set():
                try:
                    item = self._scored.get(timeout=0.01 if pending else 0.1)
                    pending.append((item, pool.submit(self._score_batch, item)))
                except queue.Empty:
                    pass
                for item, future in self._scored_ones(pending):
                    self._put(item, future.result())  # a scorer's crash stops the producer here
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _reward_workers(self) -> int:
        """Batches scored at once."""
        return self.eta + 1

    def _scored_ones(self, pending: deque) -> list[tuple[_Generated, Future]]:
        """The scored items to put now, removed from ``pending``: batches in batch order."""
        out = []
        while pending and pending[0][1].done():
            out.append(pending.popleft())
        return out

    def _score_batch(self, item: _Generated) -> DataProto:
        start, wall_start = time.perf_counter(), time.time()
        batch = self._score(item.batch, item.metrics)
        item.metrics["timing_s/rollout_reward"] = time.perf_counter() - start
        self.timeline.record(thread_lane("reward"), "reward", wall_start,
                             wall_start + item.metrics["timing_s/rollout_reward"], batch=item.index)
        return batch

    def _put(self, item: _Generated, batch: DataProto) -> None:
        batch.non_tensor_batch["rollout_batch"] = to_object_array([item.index] * len(batch))
        experiences = experiences_from_batch(batch, self.tokenizer, policy_version=item.version)
        with self._lock:
            if self._stop.is_set():
                return
            self.buffer.put(experiences)
            self._inflight.pop(item.index, None)
            self._running -= 1
            self._ready += 1
            self._metrics[item.index] = item.metrics
            self._lock.notify_all()

