"""Single controller: one driver drives groups of Ray worker processes through ``@register``-ed methods.

``Worker`` is the base class of every worker process; ``@register(dispatch_mode=...)`` marks its methods
as group methods; ``RayWorkerGroup`` starts one actor per bundle of a ``RayResourcePool`` and binds those
methods onto itself (``wg.update_actor(batch)`` splits, runs on every rank, and merges);
``create_colocated_worker_cls`` fuses several roles into one process per device. Ray is imported
only with the Ray back end's names: a one-process run (``LocalWorkerGroup``) works without it.
"""

from hybrid_rl.single_controller.decorator import Dispatch, Execute, register
from hybrid_rl.single_controller.errors import WorkerDiedError, WorkerGroupError, WorkerGroupTimeoutError, WorkerInfo
from hybrid_rl.single_controller.future import WorkerGroupFuture
from hybrid_rl.single_controller.worker import Worker
from hybrid_rl.single_controller.worker_class import RayClassWithInitArgs

_RAY_NAMES = ("RayResourcePool", "RayWorkerGroup", "create_colocated_worker_cls", "init_ray")


def __getattr__(name: str):
    """The Ray back end's names, imported on first use: a one-process run never imports Ray."""
    if name in _RAY_NAMES:
        from hybrid_rl.single_controller import ray as ray_backend

        return getattr(ray_backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Dispatch",
    "Execute",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "WorkerDiedError",
    "WorkerGroupError",
    "WorkerGroupFuture",
    "WorkerGroupTimeoutError",
    "WorkerInfo",
    "create_colocated_worker_cls",
    "init_ray",
    "register",
]
