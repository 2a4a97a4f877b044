"""``LocalWorkerGroup``: a one-worker group whose worker lives in the driver's own process.

A run of one CPU worker gains nothing from a second process: the driver waits on every call, and a
Ray cluster (GCS, raylet, dashboard, agents, monitors: ~0.6 GiB on a laptop) plus a second copy of
torch, transformers and the tokenizer (~0.5 GiB) cost memory a laptop does not have. This group
builds the same worker class (colocated roles included) in-process, behind the same surface as
:class:`~hybrid_rl.single_controller.ray.base.RayWorkerGroup`: registered methods dispatch and collect
exactly as on one Ray rank, non-blocking calls return a future (the call has already run), views come
from :meth:`spawn`.

What differs from a Ray rank, by construction:
- arguments and results are not serialized, so a worker that edited an input tensor in place would
  change the driver's copy; the worker shells never do (a test compares a run with a Ray run bit for bit);
- a call cannot be interrupted: ``call_timeout_s`` is not available, and a worker that dies (an OOM
  kill) takes the driver with it, so restarts are the next command's ``resume_mode=auto``.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any, Callable

from hybrid_rl.single_controller.decorator import RegisterSpec
from hybrid_rl.single_controller.errors import WorkerInfo
from hybrid_rl.single_controller.future import WorkerGroupFuture
from hybrid_rl.single_controller.group import WorkerGroup
from hybrid_rl.single_controller.worker_class import RayClassWithInitArgs

__all__ = ["LocalFuture", "LocalWorkerGroup"]

logger = logging.getLogger(__name__)


class LocalFuture(WorkerGroupFuture):
    """The outcome of a call that already ran in this process: its outputs, or the error it raised
    (raised again by :meth:`get`, where a Ray future would raise it)."""

    def __init__(self, outputs: list[Any], collect_fn: Callable[[list], Any], method: str,
                 workers: list[WorkerInfo], per_rank: bool = False, error: BaseException | None = None):
        super().__init__([None] * len(workers), collect_fn, method, workers, per_rank=per_rank)
        self.outputs = outputs
        self.error = error

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.collect_fn(self.outputs)

    def done(self) -> bool:
        return True

    def rank_ref(self, rank: int) -> Any:
        """Rank ``rank``'s output itself (there is no object store to refer to)."""
        return LocalFuture([self.outputs[rank]] if self.error is None else [], lambda outputs: outputs[0],
                           self.method, self.workers[rank:rank + 1], error=self.error)


RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT")
"""What :meth:`Worker.init_process_group` sets in the process when the group did not."""


def _process_group_up() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class LocalWorkerGroup(WorkerGroup):
    """``ray_cls_with_init``'s worker built in this process as rank 0 of 1, its registered methods bound
    onto this object (see the module docstring).

    Args:
        ray_cls_with_init: the worker class and its constructor arguments (as for a RayWorkerGroup).
        num_threads: torch's intra-op threads for the worker's compute (None = keep the current setting).
        name_prefix: prefix of the worker's name in messages.
    """

    def __init__(self, ray_cls_with_init: RayClassWithInitArgs, num_threads: int | None = None,
                 name_prefix: str = "local"):
        import torch

        self.ray_cls_with_init = ray_cls_with_init
        self.role = ray_cls_with_init.raw_cls.__name__
        self._method_names: list[str] = []
        # What the worker changes in this process, given back at shutdown (a notebook goes on).
        self._threads = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
        self._had_process_group = _process_group_up()  # the worker's own group is destroyed at shutdown
        # its rendezvous address too: a child process started later must not inherit a port this one held
        self._rendezvous_env = {key: os.environ.get(key) for key in RENDEZVOUS_ENV}
        if num_threads is not None:
            torch.set_num_threads(num_threads)
            os.environ["OMP_NUM_THREADS"] = str(num_threads)  # read by child processes, not by torch
        self._infos = [WorkerInfo(self.role, 0, 1, actor_name=f"{name_prefix}_{self.role}_0", pid=os.getpid(),
                                  node_ip="127.0.0.1")]
        # One slot shared by the group and its views (they copy this object's attributes), so that
        # shutdown() through any of them releases the worker for all.
        self._slot: list[Any] = [ray_cls_with_init.raw_cls(*ray_cls_with_init.args, **ray_cls_with_init.kwargs)]
        self._bind_methods(ray_cls_with_init.raw_cls, remote_prefix="")
        logger.info("built %s in the driver's process (pid %d)", self.role, os.getpid())

    @property
    def worker(self) -> Any:
        """The worker object itself (None after :meth:`shutdown`)."""
        return self._slot[0]

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> LocalFuture:
        """Call ``method_name`` with these arguments on the worker; a future of the list of outputs."""
        return self._run(method_name, f"{self.role}.{method_name}", [(args, kwargs)], lambda outputs: outputs,
                         per_rank=True)

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method_name`` on the worker; the list of its one output."""
        return self.execute_all_async(method_name, *args, **kwargs).get()

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> LocalFuture:
        """Call ``method_name`` on the worker; a future of its output."""
        return self._run(method_name, f"{self.role}.{method_name}", [(args, kwargs)], lambda outputs: outputs[0])

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method_name`` on the worker and return its output."""
        return self.execute_rank_zero_async(method_name, *args, **kwargs).get()

    def shutdown(self) -> None:
        """Let the worker release what it holds (its rollout engine), then drop it; idempotent."""
        worker, self._slot[0] = self._slot[0], None
        if worker is None:
            return
        try:
            close = getattr(worker, "close", None)
            if close is not None:
                close()
        except Exception as error:  # noqa: BLE001 - shutdown runs on error paths: never mask their error
            logger.warning("closing %s failed: %s", self.role, error)
        finally:
            del worker
            gc.collect()
            self._restore_threads()
            if not self._had_process_group and _process_group_up():
                import torch.distributed as dist

                dist.destroy_process_group()  # the worker's 1-rank group: later code in this process starts clean
            self._restore_rendezvous_env()

    def _restore_rendezvous_env(self) -> None:
        for key, value in self._rendezvous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def _restore_threads(self) -> None:
        import torch

        threads, omp = self._threads
        torch.set_num_threads(threads)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp

    def _call(self, remote_name: str, display_name: str, spec: RegisterSpec, args: tuple, kwargs: dict) -> Any:
        plan = self._dispatch(spec, args, kwargs)
        future = self._run(remote_name, display_name, plan.arguments, plan.collect_fn, plan.per_rank)
        return future.get() if spec.blocking else future

    def _run(self, method_name: str, display_name: str, arguments: list[tuple[tuple, dict]],
             collect_fn: Callable[[list], Any], per_rank: bool = False) -> LocalFuture:
        if self._slot[0] is None:
            raise RuntimeError(f"`{display_name}` called after the worker group was shut down")
        method = getattr(self._slot[0], method_name)
        try:
            outputs = [method(*args, **kwargs) for args, kwargs in arguments]
        except Exception as error:  # noqa: BLE001 - raised by get(), where a Ray future raises it
            return LocalFuture([], collect_fn, display_name, self._infos, per_rank, error=error)
        return LocalFuture(outputs, collect_fn, display_name, self._infos, per_rank)
