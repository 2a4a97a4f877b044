"""The rollout engine registry: ``@register_rollout_engine(name, ...)`` on an engine's builder.

An entry is a class or a function called as ``entry(config, model_path, tokenizer, *, device,
trust_remote_code, rows_per_call, planned_tokens)`` that returns a
:class:`~hybrid_rl.workers.rollout.base.BaseRollout` (take ``**kwargs`` for what it ignores). Its
:class:`RolloutEngineInfo` says what it is, where it runs and what runs instead where it cannot:
:func:`hybrid_rl.workers.rollout.build_rollout` reads it and never names an engine. The built-in
entries (``vllm``, ``hf``) are light builders in :mod:`hybrid_rl.workers.rollout` that import their
engine only when called, so the config check of ``rollout.name`` imports no engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from hybrid_rl.utils.registry import Registry, first_doc_line

__all__ = ["RolloutEngineInfo", "describe_rollout_engines", "get_rollout_engine", "register_rollout_engine",
           "registered_rollout_engines", "rollout_engine_info", "rollout_engine_names", "unregister_rollout_engine"]

UnavailableFn = Callable[[Any, str, str, bool], Optional[str]]
"""``(rollout config, model path, device, trust_remote_code) -> None when the engine can run here, else why not``."""


@dataclass(frozen=True)
class RolloutEngineInfo:
    """What a rollout engine is, where it runs and what runs instead; ``build_rollout``, ``--help`` read it."""

    description: str = ""
    """One line for listings; default: the entry's first docstring sentence."""
    devices: tuple[str, ...] = ()
    """Device types it runs on (``cpu``, ``cuda``); empty: any device torch has."""
    backend: str = ""
    """What generates the tokens, named in the fallback notice (e.g. ``transformers generate``)."""
    fallback: Optional[str] = None
    """The engine built instead where this one cannot run (``unavailable`` says why, or the engine
    raises :class:`~hybrid_rl.workers.rollout.base.EngineRefusedModel`); None: that is an error."""
    unavailable: Optional[UnavailableFn] = None
    """Why it cannot run here (None: it can), asked before building it; None: no pre-check."""


_REGISTRY: Registry[RolloutEngineInfo] = Registry("rollout engine", "actor_rollout_ref.rollout.name")


def register_rollout_engine(name: str, *, devices: tuple[str, ...] = (), backend: str = "",
                            fallback: Optional[str] = None, unavailable: Optional[UnavailableFn] = None,
                            description: Optional[str] = None) -> Callable:
    """Decorator registering a rollout engine (a class or builder function) as ``rollout.name=<name>``;
    the keywords are its :class:`RolloutEngineInfo`. A second entry under a name raises."""

    def decorator(entry: Callable) -> Callable:
        info = RolloutEngineInfo(description=first_doc_line(entry) if description is None else description,
                                 devices=tuple(devices), backend=backend or name, fallback=fallback,
                                 unavailable=unavailable)
        return _REGISTRY.register(name, info)(entry)

    return decorator


def get_rollout_engine(name: str) -> Callable:
    """The entry registered as ``name``; ValueError naming the registered ones otherwise."""
    return _REGISTRY.get(name)


def rollout_engine_info(name: str) -> RolloutEngineInfo:
    """What the engine ``name`` is and needs (:class:`RolloutEngineInfo`)."""
    return _REGISTRY.info(name)


def registered_rollout_engines() -> list[str]:
    """Registered names, sorted."""
    return _REGISTRY.names()


def rollout_engine_names():
    """The registered names in registration order, read at each use (``ROLLOUT_NAMES``)."""
    return _REGISTRY.name_view()


def describe_rollout_engines() -> dict[str, RolloutEngineInfo]:
    """Every engine's info, by name."""
    return _REGISTRY.describe()


def unregister_rollout_engine(name: str) -> None:
    """Remove an engine (tests, plugin reloads); a no-op for unknown names."""
    _REGISTRY.unregister(name)
