"""Running tool and interaction coroutines concurrently, each bounded in time, never raising.

All calls run on one background event loop (tool instances may hold loop-bound resources, so
create/execute/release of an instance share a loop). Each coroutine is bounded by
``asyncio.wait_for``; a result is ``("ok", value)``, ``("error", message)`` or ``("timeout", message)``.

A tool that blocks the loop synchronously (``time.sleep`` inside ``async def``) cannot be cancelled:
the caller stops waiting after the timeout plus a grace period, every unfinished call of the round
becomes a timeout, and the wedged loop is abandoned (its daemon thread is left behind) for a fresh
one, so one bad tool never hangs or crashes the rollout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Callable, Iterable

__all__ = ["AsyncRunner"]

_GRACE_S = 1.0


class AsyncRunner:
    """A private event loop on a daemon thread; :meth:`run` executes a round of coroutines on it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.num_abandoned_loops = 0

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="hybrid_rl-tools", daemon=True).start()
            self._loop = loop
        return self._loop

    def run(self, calls: Iterable[Callable[[], Awaitable[Any]]], timeout_s: float) -> list[tuple[str, Any]]:
        """Run ``calls`` (zero-argument callables returning a coroutine, called on the loop so that
        even a synchronous raise or a wrong signature is caught) concurrently; one ``(status, value)``
        each, in order. ``timeout_s <= 0``: no time bound."""
        calls = list(calls)
        if not calls:
            return []
        loop = self._ensure_loop()
        futures = [asyncio.run_coroutine_threadsafe(_bounded(c, timeout_s), loop) for c in calls]
        done, pending = concurrent.futures.wait(futures, timeout=timeout_s + _GRACE_S if timeout_s > 0 else None)
        results = []
        for future in futures:
            if future in done:
                try:
                    results.append(future.result())
                except BaseException as exc:  # e.g. the task was cancelled from inside the tool
                    results.append(("error", f"{type(exc).__name__}: {str(exc)[:200]}"))
            else:
                future.cancel()
                results.append(("timeout", f"no answer within {timeout_s:g} s (the tool blocked its event loop)"))
        if pending:  # the loop is blocked by synchronous code: leave it behind
            self._loop = None
            self.num_abandoned_loops += 1
        return results

    def close(self) -> None:
        """Stop the loop (pending calls are dropped)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


async def _bounded(call: Callable[[], Awaitable[Any]], timeout_s: float) -> tuple[str, Any]:
    try:
        return "ok", await asyncio.wait_for(call(), timeout=timeout_s if timeout_s > 0 else None)
    except asyncio.TimeoutError:
        return "timeout", f"no answer within {timeout_s:g} s"
    except BaseException as exc:  # untrusted tool code: any failure (even SystemExit) becomes an observation
        return "error", f"{type(exc).__name__}: {str(exc)[:200]}"
