"""The result of a non-blocking worker-group call, and the failure-aware wait behind every call.

Waiting never uses a bare ``ray.get(refs)``: that returns only when *all* ranks finish, so if one rank
dies while the others block in a collective, the driver would hang. Instead results are taken one by
one as they arrive (``ray.wait``); the first dead worker raises :class:`WorkerGroupError` at once, and
a ``timeout_s`` deadline raises :class:`WorkerGroupTimeoutError` naming the ranks that did not answer.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from hybrid_rl.single_controller.errors import (
    WorkerDiedError,
    WorkerGroupError,
    WorkerGroupTimeoutError,
    WorkerInfo,
    fill_from_ray_error,
    short_reason,
    tail_worker_log,
)

__all__ = ["WorkerGroupFuture", "object_ref_types", "wait_for_results"]

if TYPE_CHECKING:
    import ray


def object_ref_types() -> tuple[type, ...]:
    """``(ray.ObjectRef,)`` once Ray is imported, else ``()``: a process that never imported Ray (a
    one-process run, where Ray may not even be installed) holds no object refs, so it needs no Ray to
    tell that a value is not one."""
    ray = sys.modules.get("ray")
    return (ray.ObjectRef,) if ray is not None and hasattr(ray, "ObjectRef") else ()


class WorkerGroupFuture:
    """Pending outputs of one worker-group call (``blocking=False``).

    ``get()`` waits (failure-aware) and returns what the blocking call would have returned. The future
    can also be passed as an argument to the next worker-group call without being fetched by the driver.
    """

    def __init__(self, refs: list[ray.ObjectRef], collect_fn: Callable[[list], Any], method: str,
                 workers: list[WorkerInfo], timeout_s: float | None = None, per_rank: bool = False):
        assert len(refs) == len(workers), (len(refs), len(workers))
        self.refs = list(refs)
        self.collect_fn = collect_fn
        self.method = method
        self.workers = list(workers)
        self.timeout_s = timeout_s
        self._per_rank = per_rank

    def get(self) -> Any:
        """Wait for every rank and return the collected result (raises WorkerGroupError on a dead worker)."""
        return self.collect_fn(wait_for_results(self.refs, self.workers, self.method, self.timeout_s))

    def done(self) -> bool:
        """True once every rank has finished (successfully or not); never blocks."""
        import ray

        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def is_per_rank(self, world_size: int) -> bool:
        """True if the result is the list of the ``world_size`` per-rank outputs (rank ``i`` -> item ``i``)."""
        return self._per_rank and len(self.refs) == world_size

    def rank_ref(self, rank: int) -> ray.ObjectRef:
        """The ObjectRef of one rank's output (Ray resolves it when passed as a top-level argument)."""
        return self.refs[rank]

    def __repr__(self) -> str:
        return f"WorkerGroupFuture({self.method!r}, {len(self.refs)} ranks)"


def wait_for_results(refs: list[ray.ObjectRef], workers: list[WorkerInfo], method: str,
                     timeout_s: float | None = None) -> list[Any]:
    """Outputs of ``refs`` in order; raise as soon as one worker is found dead or the deadline passes."""
    import ray
    from ray.exceptions import RayTaskError

    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        if not ready:
            raise WorkerGroupTimeoutError(_timeout_message(
                [workers[index[r]] for r in pending], len(refs), method, timeout_s))
        i = index[ready[0]]
        try:
            results[i] = _get_one(ready[0], workers[i], method)
        except RayTaskError:
            _raise_if_a_peer_died(pending, index, workers, method)
            raise
    return results


PEER_DEATH_GRACE_S = 10.0
"""After a rank's method raises, how long to look for a dead peer behind it (error path only)."""


def _raise_if_a_peer_died(pending: list[ray.ObjectRef], index: dict, workers: list[WorkerInfo], method: str) -> None:
    """A rank failing inside a collective (gloo: "Connection reset by peer") is usually the echo of a
    peer that died: report the dead worker, the root cause the supervisor restarts from, instead."""
    if not pending:
        return
    import ray
    from ray.exceptions import RayActorError

    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_GRACE_S)
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError as e:
            raise WorkerDiedError(_died_message(workers[index[ref]], method, e)) from e
        except Exception:  # noqa: BLE001 - another rank's own error: the first one is reported
            continue


def _get_one(ref: ray.ObjectRef, worker: WorkerInfo, method: str) -> Any:
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayActorError as e:
        raise WorkerDiedError(_died_message(worker, method, e)) from e
    except RayTaskError as e:
        # The method itself raised: ray re-raises it as (a subclass of) the original exception type,
        # with the remote traceback in the message. An upstream worker that died while this one was
        # fetching its input shows up here too, as the cause.
        if isinstance(e.cause, RayActorError):
            raise WorkerGroupError(
                f"{worker.describe()} failed in `{method}` because a worker whose output it needed died: "
                f"{short_reason(e.cause)}") from e
        raise


def _died_message(worker: WorkerInfo, method: str, error: Exception) -> str:
    fill_from_ray_error(worker, error)
    if method == "__init__":
        advice = "The worker could not start: fix the error above (the group's other workers were stopped)."
    else:
        advice = ("The other workers of the group may be stuck in a collective with it: shut the group down "
                  "(RayWorkerGroup.shutdown) or exit, then restart from the last checkpoint.")
    return f"worker {worker.describe()} died during `{method}`: {short_reason(error)}\n{tail_worker_log(worker)}\n{advice}"


def _timeout_message(silent: list[WorkerInfo], world_size: int, method: str, timeout_s: float | None) -> str:
    names = "; ".join(w.describe() for w in silent)
    first = silent[0]
    return (f"`{method}` did not finish within call_timeout_s={timeout_s} s: {len(silent)} of {world_size} "
            f"workers did not answer: {names}. A worker may be hung (deadlock in a collective, stuck I/O, "
            f"an endless loop) or just slow: raise call_timeout_s if the work is legitimately long.\n"
            f"Log of {first.role} rank {first.rank}:\n{tail_worker_log(first)}")
