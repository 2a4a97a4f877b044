"""The step timeline: when each named step ran, on which lane, over wall time (``timeline.jsonl``).

One JSON line per span, appended as the run goes (the studio reads the file while the run is going)::

    {"step": 3, "worker": "trainer", "name": "update_actor", "start": 1764464000.125, "end": 1764464001.5}

* ``start`` / ``end``: :func:`time.time` seconds, so the driver's threads and any process share one axis.
* ``worker``: the lane. ``trainer`` is the driver's training loop (every named step of
  :meth:`~hybrid_rl.trainer.core.loop.TrainerCore.step_plan`, timed by
  :func:`~hybrid_rl.trainer.core.loop.timed`, so a span's ``end - start`` is its ``timing_s/<name>``). The
  decoupled mode adds its producer's stages: ``rollout`` (the generation stage: ``generate``,
  ``load_weights``, the jobs it runs for the trainer such as ``validate``) and ``reward/<i>`` (each
  scoring thread's ``reward``).
* ``step``: the latest training step the trainer had started when the span started (0 before the
  first; a resumed run's checkpoint step until its next); the trainer's ``step`` span encloses its
  step's named steps: it marks the step's boundaries.
* Spans may nest on one lane (``wait_batch`` inside ``take_experiences``); spans of one lane that do not
  nest never overlap.
* Idle time: a wait a lane knows it makes is a span of its own, named ``wait_*`` (``wait_batch``: the
  trainer waits for a batch of ready rows; ``wait_capacity``: the generation stage waits for the staleness
  bound, that is for the trainer; ``wait_reward``: it waits for a free scoring thread). A gap between
  spans is time no named step accounts for (the driver's own bookkeeping).
* Optional extra keys: ``batch`` (the producer's prompt-batch index), ``version`` (the weights loaded).

A :class:`Timeline` is safe to use from several threads; one without a path records nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["NULL_TIMELINE", "TIMELINE_FILE", "SpanRun", "Timeline", "thread_lane"]

logger = logging.getLogger(__name__)

TIMELINE_FILE = "timeline.jsonl"
"""The timeline's file in the run folder (``trainer.default_local_dir``), beside ``metrics.jsonl``."""


class Timeline:
    """Appends spans to ``path`` (created readable by its owner only); ``path=None``: records nothing.

    ``step`` is the latest training step started: the trainer sets it, every lane's spans carry it. The
    timeline is an aid, never a reason for a run to stop: a file that cannot be opened or written (a
    link there, a full disk) is logged once and the timeline records nothing more.
    """

    def __init__(self, path: Optional[str]):
        self.path = path
        self.step = 0
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
                self._file = os.fdopen(fd, "a", encoding="utf-8")
            except OSError as error:
                self._give_up(error)

    @property
    def enabled(self) -> bool:
        """Whether spans reach a file."""
        return self._file is not None

    def record(self, worker: str, name: str, start: float, end: float, step: Optional[int] = None,
               **extra: Any) -> None:
        """One span of lane ``worker`` (``step``: default the step in progress)."""
        if self._file is None:
            return
        row = {"step": self.step if step is None else step, "worker": worker, "name": name,
               "start": start, "end": end, **extra}
        line = json.dumps(row) + "\n"
        with self._lock:
            if self._file is None:  # closed meanwhile by the run's end: the span is dropped
                return
            try:
                self._file.write(line)
                self._file.flush()  # a whole line at a time: the studio reads the file as it grows
            except OSError as error:
                self._file = None
                self._give_up(error)

    def _give_up(self, error: OSError) -> None:
        logger.warning("the step timeline %s is not written from here on (%s); the run goes on. Fix: free the "
                       "disk or remove what is in its place", self.path, error)

    @contextmanager
    def span(self, worker: str, name: str, **extra: Any) -> Iterator[None]:
        """Record the block as one span (also when it raises: the time was spent)."""
        step, start = self.step, time.time()
        try:
            yield
        finally:
            self.record(worker, name, start, time.time(), step=step, **extra)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


NULL_TIMELINE = Timeline(None)
"""Records nothing: the timeline of a trainer not fitting and of a producer built without one."""


class SpanRun:
    """Contiguous spans of one lane and name merged into one: a stage that polls (waits of 0.1 s in a
    loop, the streaming engines' pumps) records its run of polls as one span, not one per poll.

    Args:
        gap_s: a span starting at most this long after the last one ended extends it.
    """

    def __init__(self, timeline: Timeline, worker: str, name: str, gap_s: float = 0.005):
        self.timeline, self.worker, self.name, self.gap_s = timeline, worker, name, gap_s
        self._open: Optional[tuple[int, float, float]] = None  # (step, start, end)

    def add(self, start: float, end: float) -> None:
        """A span ``[start, end]``: extends the open one when it follows it closely, else starts one."""
        if self._open is not None and start - self._open[2] <= self.gap_s:
            self._open = (self._open[0], self._open[1], end)
            return
        self.flush()
        self._open = (self.timeline.step, start, end)

    def flush(self) -> None:
        """Record the open span (something else happens on the lane now)."""
        if self._open is not None:
            step, start, end = self._open
            self._open = None
            self.timeline.record(self.worker, self.name, start, end, step=step)


def thread_lane(prefix: str) -> str:
    """``<prefix>/<i>``: the lane of a pool thread named ``..._<i>`` (``ThreadPoolExecutor``'s names)."""
    return f"{prefix}/{threading.current_thread().name.rsplit('_', 1)[-1]}"
