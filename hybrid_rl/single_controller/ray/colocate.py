"""Colocation: several worker roles in ONE Ray actor process per device.

The hybrid engine keeps the actor, the reference policy, the rollout engine and the critic of one
device in one process, so they share the device and can hand weights to each other in memory.
``create_colocated_worker_cls({"actor_rollout": ..., "critic": ...})`` builds a worker class that
constructs every role's worker inside itself and exposes each registered method as
``<role>_<method>`` (same dispatch/execute/blocking spec). ``RayWorkerGroup.spawn(roles)`` then gives
one view per role with the plain method names.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from hybrid_rl.single_controller.decorator import MAGIC_ATTR, RegisterSpec, registered_methods
from hybrid_rl.single_controller.worker_class import RayClassWithInitArgs
from hybrid_rl.single_controller.worker import Worker

__all__ = ["create_colocated_worker_cls"]

logger = logging.getLogger(__name__)


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One worker class hosting every ``role -> RayClassWithInitArgs`` of ``class_dict`` (see module doc)."""
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    exposed: dict[str, tuple[str, str]] = {}
    for role, cia in class_dict.items():
        if not role.isidentifier():
            raise ValueError(f"role name {role!r} must be a Python identifier (it prefixes method names)")
        if not isinstance(cia, RayClassWithInitArgs):
            raise TypeError(f"class_dict[{role!r}] must be a RayClassWithInitArgs, got {type(cia).__name__}")
        for name in registered_methods(cia.raw_cls):
            fused_name = f"{role}_{name}"
            if fused_name in exposed:
                raise ValueError(f"colocated method name {fused_name!r} is produced by both {exposed[fused_name]} "
                                 f"and {(role, name)}; rename a role or a method")
            exposed[fused_name] = (role, name)

    role_classes = {role: cia.raw_cls for role, cia in class_dict.items()}
    init_args = {role: (cia.args, cia.kwargs) for role, cia in class_dict.items()}

    class ColocatedWorker(Worker):
        """Hosts one worker per role in this process; ``worker_dict[role]`` is that role's worker."""

        def __init__(self) -> None:
            super().__init__()
            # Roles are built in class_dict order, so a later role may rely on an earlier one's set-up
            # (e.g. the critic reusing the process group the actor created).
            self.worker_dict: dict[str, Worker] = {}
            for role, cls in role_classes.items():
                args, kwargs = init_args[role]
                self.worker_dict[role] = cls(*args, **kwargs)

        def close(self) -> None:
            for role, worker in reversed(list(self.worker_dict.items())):
                close = getattr(worker, "close", None)
                try:
                    if close is not None:
                        close()
                except Exception as error:  # noqa: BLE001 - the other roles must still be closed
                    logger.warning("closing the %s worker failed: %s", role, error)

    for fused_name, (role, name) in exposed.items():
        spec = registered_methods(role_classes[role])[name]
        setattr(ColocatedWorker, fused_name, _delegate(role, name, fused_name, spec))
    ColocatedWorker._hr_role_classes = role_classes
    ColocatedWorker.__name__ = "Colocated_" + "_".join(class_dict)
    return RayClassWithInitArgs(ColocatedWorker)


def _delegate(role: str, name: str, fused_name: str, spec: RegisterSpec) -> Callable[..., Any]:
    """A method forwarding to ``self.worker_dict[role].<name>`` (whose own @register wrapper fetches
    futures and drops padding rows), carrying the same spec so the group binds it the same way."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker_dict[role], name)(*args, **kwargs)

    method.__name__ = fused_name
    setattr(method, MAGIC_ATTR, spec)
    return method
