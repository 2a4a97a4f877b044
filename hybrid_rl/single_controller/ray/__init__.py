"""Ray back end of the single controller: resource pools, worker groups, colocation, ``init_ray``.

Each name is imported on first use, so ``create_colocated_worker_cls`` (which a one-process run uses
too) does not import Ray."""

import importlib

_WHERE = {
    "RayClassWithInitArgs": "hybrid_rl.single_controller.worker_class",
    "RayWorkerGroup": "hybrid_rl.single_controller.ray.base",
    "create_colocated_worker_cls": "hybrid_rl.single_controller.ray.colocate",
    "init_ray": "hybrid_rl.single_controller.ray.ray_init",
    "worker_env_vars": "hybrid_rl.single_controller.ray.ray_init",
    "RayResourcePool": "hybrid_rl.single_controller.ray.resource_pool",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
