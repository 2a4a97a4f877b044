"""Progress of a batch of agent rows on the console while they run.

A slow agent under ``agent.timeout_s=600`` would otherwise look like a hang: nothing is printed
between two step lines. :class:`AgentProgress` counts the rows done, running and failed and a daemon
thread logs them at INFO on the ``hybrid_rl.agents.progress`` logger (the console's filter passes
it in the rollout workers too, :data:`hybrid_rl.utils.log_setup.PROGRESS_LOGGERS`): first after
``interval_s``, then every ``interval_s`` when a row finished since the last line and every
``6 * interval_s`` when none did (so a hung row still shows how long it has run). A batch that
finishes within ``interval_s`` prints nothing; one that printed gets a closing line (:meth:`finish`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Awaitable, Callable, Optional

__all__ = ["AgentProgress", "PROGRESS_LOGGER"]

PROGRESS_LOGGER = "hybrid_rl.agents.progress"
logger = logging.getLogger(PROGRESS_LOGGER)

_QUIET_ROUNDS = 6
"""Intervals without a finished row between two lines (a hung batch still says it runs)."""


class AgentProgress:
    """Counts of ``total`` agent rows, logged every ``interval_s`` while they run (None: never).

    Use as a context manager around the run; wrap each row's coroutine with :meth:`track`.
    """

    def __init__(self, total: int, interval_s: Optional[float]):
        self.total = total
        self.interval_s = interval_s
        self.done = self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._printed = False
        self._thread: Optional[threading.Thread] = None

    async def track(self, coro: Awaitable[Any], valid: Callable[[Any], bool] = lambda value: True) -> Any:
        """Await one row's coroutine, counting it done when it returns a ``valid`` value and failed when
        it returns another, raises or is cancelled (its timeout)."""
        try:
            value = await coro
        except BaseException:
            with self._lock:
                self.failed += 1
            raise
        ok = valid(value)
        with self._lock:
            self.done += ok
            self.failed += not ok
        return value

    def line(self) -> str:
        """``agent rows: 3/16 done, 12 running, 1 failed (42 s)``."""
        with self._lock:
            done, failed = self.done, self.failed
        running = self.total - done - failed
        return (f"agent rows: {done}/{self.total} done, {running} running, {failed} failed "
                f"({time.monotonic() - self._started:.0f} s)")

    def __enter__(self) -> "AgentProgress":
        self._started = time.monotonic()
        if self.interval_s is not None and self.total > 0:
            self._thread = threading.Thread(target=self._report, name="hybrid_rl-agent-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self, done: int, failed: int) -> None:
        """The rows' outcome as judged after the run (a loop that never answered is a failure too):
        a closing line, when progress lines were printed."""
        with self._lock:
            self.done, self.failed = done, failed
        if self._printed:
            logger.info("%s: finished", self.line())

    def _report(self) -> None:
        last, quiet = (0, 0), 0
        while not self._stop.wait(self.interval_s):
            with self._lock:
                now = (self.done, self.failed)
            quiet = 0 if now != last else quiet + 1
            if not self._printed or now != last or quiet % _QUIET_ROUNDS == 0:
                logger.info("%s", self.line())
                self._printed = True
            last = now
