"""Text environments with Gymnasium's interface, registered like tools.

An environment is one episode's state (a new instance per trajectory)::

    reset(seed=None, options=None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

as Gymnasium's ``Env`` (and SkyRL-gym, OpenEnv, verifiers' multi-turn environments), with text for
observations and actions: the action is the model's turn, decoded. Methods may be plain or ``async``
(an environment that waits on a sandbox or a web page). :class:`hybrid_rl.agents.env_loop.EnvAgentLoop`
runs episodes as agent loops (docs/agents.md, "Environments").

Register with ``@register_env("name")`` and name it ``env: package.module:name`` in the YAML (the module
is imported first, which registers it; a bare ``name`` works once some import ran the decorator), or
name a class by its dotted path; a class need not subclass :class:`BaseTextEnv`, any class with
``reset`` and ``step`` is accepted.
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, Callable, Optional

from hybrid_rl.agents.tool import class_registry

__all__ = ["BaseTextEnv", "call_env", "get_env_cls", "register_env", "registered_envs"]


class BaseTextEnv(abc.ABC):
    """Subclass and implement :meth:`reset` and :meth:`step`.

    Args:
        **kwargs: the environment's settings (the agent-loop YAML entry's ``env_kwargs`` and the row's
            ``extra_info.env_kwargs``, the row's winning).
    """

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs

    @abc.abstractmethod
    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        """Start the episode: the first observation (shown to the model as a user turn) and an info dict."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply the model's turn: (observation, reward, terminated, truncated, info)."""

    def close(self) -> None:
        """Free the episode's resources (called when the trajectory ends)."""


_ENVS = class_registry("environment", "actor_rollout_ref.rollout.agent.agent_loop_config_path: entries' env")


def register_env(name: str) -> Callable[[type], type]:
    """Class decorator: make an environment available as ``env: <name>`` in an env agent loop's entry."""

    def decorator(cls: type) -> type:
        if not _conforms(cls):
            raise ValueError(f"@register_env({name!r}) decorates {cls!r}, which has no reset() and step(). Fix: "
                             "subclass hybrid_rl.agents.BaseTextEnv.")
        return _ENVS.add(name, cls)

    return decorator


def registered_envs() -> list[str]:
    """Names registered with :func:`register_env`."""
    return _ENVS.names()


def _conforms(cls: Any) -> bool:
    return isinstance(cls, type) and callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None))


def get_env_cls(name: str, where: str) -> type:
    """An environment named in YAML, resolved to its class; one-line ValueError otherwise. ``name`` is a
    registered name, ``package.module:name`` (the module is imported first, so its ``@register_env``
    runs, then ``name`` is a registered name or the module's attribute) or a dotted class path."""
    if name in _ENVS:
        return _ENVS.get(name)
    from hybrid_rl.agents.tool import import_object

    module, colon, attr = str(name).partition(":")
    fix = (f"Fix: use a registered environment ({', '.join(registered_envs()) or 'none registered'}), "
           "package.module:name (the module that registers it, then its name) or the dotted path of a class with "
           "reset() and step()")
    if not colon and "." not in module:  # a bare name nobody registered (yet): its module was never imported
        raise ValueError(f"{where}: {name!r} is not a registered environment; an @register_env name is known only "
                         f"once its module is imported, so name the module too, e.g. env: my_pkg.envs:{name}. {fix}.")
    try:
        cls = _import_module_attr(module, attr) if colon else import_object(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot import environment {name!r} ({type(exc).__name__}: {exc}). {fix}.") from None
    if not _conforms(cls):
        raise ValueError(f"{where}: {name!r} is not an environment. {fix}.")
    return cls


def _import_module_attr(module: str, attr: str) -> Any:
    """``module:attr``: import ``module``; ``attr`` registered by it, else the module's attribute."""
    import importlib

    if not module or not attr:
        raise ValueError("expected package.module:name")
    loaded = importlib.import_module(module)
    return _ENVS.get(attr) if attr in _ENVS else getattr(loaded, attr)


async def call_env(method: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call a plain or ``async`` environment method."""
    result = method(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result
