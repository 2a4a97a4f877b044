"""The objective registry: ``@register_objective`` on an :class:`~hybrid_rl.objectives.base.Objective`
subclass, looked up by name, built from its own config dataclass.

An entry describes itself (:class:`ObjectiveInfo`): what it trains, whether its rows come in
chosen/rejected pairs, and which modes can use it. ``build_objective(name, settings)`` turns a plain
mapping (a YAML section) into the entry's ``Config`` and fails in one line naming an unknown key and
the valid ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from hybrid_rl.algorithms.registry import Registry, first_doc_line

__all__ = ["ObjectiveInfo", "build_objective", "describe_objectives", "get_objective_cls", "objective_info",
           "register_objective", "registered_objectives", "unregister_objective"]


@dataclass(frozen=True)
class ObjectiveInfo:
    """What an objective is and needs; listings (``--help``, the studio) and the config checks read it."""

    paired: bool = False
    """Its rows come in (chosen, rejected) pairs, adjacent in the batch (rows 2i and 2i+1): the
    learner keeps each pair in one micro-batch."""
    needs_reference: bool = False
    """It reads the reference policy's log-probs (``ref_log_prob``): the run builds a reference."""
    description: str = ""
    """One line for listings; default: the class docstring's first sentence."""


_REGISTRY: Registry[ObjectiveInfo] = Registry("objective", "actor_rollout_ref.actor.objective.name")


def register_objective(name: str, *, paired: bool = False, needs_reference: bool = False,
                       description: Optional[str] = None) -> Callable[[type], type]:
    """Class decorator registering an Objective subclass under ``name`` (sets its ``name``)."""

    def decorator(cls: type) -> type:
        cls.name = name
        info = ObjectiveInfo(paired=paired, needs_reference=needs_reference,
                             description=first_doc_line(cls) if description is None else description)
        return _REGISTRY.register(name, info)(cls)

    return decorator


def get_objective_cls(name: str) -> type:
    """The class registered as ``name``; ValueError naming the valid names otherwise."""
    return _REGISTRY.get(name)


def objective_info(name: str) -> ObjectiveInfo:
    """What the objective ``name`` needs (:class:`ObjectiveInfo`)."""
    return _REGISTRY.info(name)


def registered_objectives() -> list[str]:
    """Registered names, sorted."""
    return _REGISTRY.names()


def describe_objectives() -> dict[str, ObjectiveInfo]:
    """Every entry's info, by name."""
    return _REGISTRY.describe()


def unregister_objective(name: str) -> None:
    """Remove an entry (tests, plugin reloads); a no-op for unknown names."""
    _REGISTRY.unregister(name)


def build_config(cls: type, settings: Optional[Mapping[str, Any]], key: str) -> Any:
    """``cls.Config(**settings)``; an unknown key is one line naming ``key`` and the valid keys."""
    config_cls = getattr(cls, "Config", None)
    settings = dict(settings or {})
    if config_cls is None:
        if settings:
            raise ValueError(f"{key}: the {cls.name} objective has no settings, got {sorted(settings)}. "
                             f"Fix: remove them.")
        return None
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = [k for k in settings if k not in valid]
    if unknown:
        raise ValueError(f"{key}.{unknown[0]} is not a setting of the {cls.name} objective; valid: {valid}. "
                         "Fix: spell it as one of them or remove it.")
    return config_cls(**settings)


def build_objective(name: str, settings: Optional[Mapping[str, Any]] = None, *,
                    key: str = "actor_rollout_ref.actor.objective") -> Any:
    """An instance of the objective ``name`` with its ``Config`` built from ``settings``."""
    cls = get_objective_cls(name)
    return cls(build_config(cls, settings, key))
