"""``WorkerGroup``: what every worker group shares, whatever hosts its workers.

A group binds each ``@register``-ed method of its worker class onto itself (``wg.update_actor(batch)``
dispatches, runs on the ranks and collects; see :mod:`hybrid_rl.single_controller.decorator`), and a
group of colocated roles gives one view per role (:meth:`WorkerGroup.spawn`). Subclasses say where the
workers run: :class:`~hybrid_rl.single_controller.ray.base.RayWorkerGroup` (one Ray actor per device)
or :class:`~hybrid_rl.single_controller.local.LocalWorkerGroup` (one worker in the driver's process).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable

from hybrid_rl.single_controller.decorator import (DISPATCH_MODE_FN_REGISTRY, Dispatch, Execute, RegisterSpec,
                                                  collect_first, collect_list, registered_methods)
from hybrid_rl.single_controller.errors import WorkerInfo

__all__ = ["WorkerGroup"]


@dataclasses.dataclass
class _CallPlan:
    """One group call after dispatch."""

    ranks: list[int]
    """Ranks that run the method."""
    arguments: list[tuple[tuple, dict]]
    """``(args, kwargs)`` of each of those ranks."""
    collect_fn: Callable[[list], Any]
    """Turns their outputs (in rank order) into the caller's result."""
    per_rank: bool
    """The result is the list of every rank's output (a future of it can be scattered back per rank)."""


class WorkerGroup(abc.ABC):
    """Method binding, role views and identity of a worker group; :meth:`_call` runs one call."""

    role: str
    """Name shown in messages: the worker class's name, or the role of a view."""
    _infos: list[WorkerInfo]
    _method_names: list[str]
    ray_cls_with_init: Any

    @property
    def world_size(self) -> int:
        """Number of workers (ranks)."""
        return len(self._infos)

    @property
    def worker_infos(self) -> list[WorkerInfo]:
        """Identity (pid, node, log files) of every worker, in rank order."""
        return list(self._infos)

    @property
    def method_names(self) -> list[str]:
        """Names of the registered methods bound on this group (or view)."""
        return list(self._method_names)

    def spawn(self, prefix_set: set[str] | list[str]) -> dict[str, WorkerGroup]:
        """``{role: view}`` for a group of colocated workers: each view shares the workers and exposes that
        role's registered methods under their plain names (``views["critic"].compute_values(batch)``).
        """
        role_classes = getattr(self.ray_cls_with_init.raw_cls, "_hr_role_classes", None)
        if role_classes is None:
            raise ValueError(f"spawn() needs a group built from create_colocated_worker_cls(...); "
                             f"{self.role} is a single-role worker class")
        unknown = sorted(set(prefix_set) - set(role_classes))
        if unknown:
            raise ValueError(f"unknown roles {unknown} for spawn(); this group hosts {sorted(role_classes)}")
        return {role: self._view(role, role_classes[role]) for role in prefix_set}

    @abc.abstractmethod
    def _call(self, remote_name: str, display_name: str, spec: RegisterSpec, args: tuple, kwargs: dict) -> Any:
        """Run the worker method ``remote_name`` as ``spec`` says (dispatch, execute, collect)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop every worker of the group (and of its views)."""

    def _dispatch(self, spec: RegisterSpec, args: tuple, kwargs: dict) -> _CallPlan:
        """Which ranks run a call of ``spec``, with which arguments, and how their outputs are collected."""
        dispatch_fn, collect_fn = DISPATCH_MODE_FN_REGISTRY[spec.dispatch_mode]
        per_rank = dispatch_fn(self.world_size, args, kwargs)
        if spec.execute_mode is Execute.RANK_ZERO or spec.dispatch_mode is Dispatch.RANK_ZERO:
            return _CallPlan([0], per_rank[:1], collect_first, per_rank=False)
        return _CallPlan(list(range(self.world_size)), per_rank, collect_fn, per_rank=collect_fn is collect_list)

    def _bind_methods(self, cls: type, remote_prefix: str) -> None:
        for name, spec in registered_methods(cls).items():
            if hasattr(type(self), name):
                raise ValueError(f"{cls.__name__}.{name} is @register-ed but clashes with "
                                 f"{type(self).__name__}.{name}; rename the worker method")
            setattr(self, name, self._make_group_method(remote_prefix + name, name, spec))
            self._method_names.append(name)

    def _make_group_method(self, remote_name: str, name: str, spec: RegisterSpec) -> Callable[..., Any]:
        def group_method(*args: Any, **kwargs: Any) -> Any:
            return self._call(remote_name, f"{self.role}.{name}", spec, args, kwargs)

        group_method.__name__ = name
        return group_method

    def _view(self, role: str, role_cls: type) -> WorkerGroup:
        view = object.__new__(type(self))
        for key, value in self.__dict__.items():
            if key not in self._method_names:
                setattr(view, key, value)
        view.role = role
        view._infos = [dataclasses.replace(info, role=role) for info in self._infos]
        view._method_names = []
        view._bind_methods(role_cls, remote_prefix=f"{role}_")
        return view

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.role}, world_size={self.world_size}, methods={self._method_names})"
