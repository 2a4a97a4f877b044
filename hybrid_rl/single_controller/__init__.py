"""Single controller: one driver drives groups of Ray worker processes through ``@register``-ed methods.

``Worker`` is the base class of every worker process; ``@register(dispatch_mode=...)`` marks its methods
as group methods; ``RayWorkerGroup`` starts one actor per bundle of a ``RayResourcePool`` and binds those
methods onto itself (``wg.update_actor(batch)`` splits, runs on every rank, and merges);
``create_colocated_worker_cls`` fuses several roles into one process per device.
"""

from hybrid_rl.single_controller.decorator import Dispatch, Execute, register
from hybrid_rl.single_controller.errors import WorkerDiedError, WorkerGroupError, WorkerGroupTimeoutError, WorkerInfo
from hybrid_rl.single_controller.future import WorkerGroupFuture
from hybrid_rl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    init_ray,
)
from hybrid_rl.single_controller.worker import Worker

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
