"""Ray back end of the single controller: resource pools, worker groups, colocation, ``init_ray``."""

from hybrid_rl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup
from hybrid_rl.single_controller.ray.colocate import create_colocated_worker_cls
from hybrid_rl.single_controller.ray.ray_init import init_ray, worker_env_vars
from hybrid_rl.single_controller.ray.resource_pool import RayResourcePool

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "init_ray",
    "worker_env_vars",
]
