"""Tools a multi-turn rollout can call: the base class, the response type and the registry.

The interface is veRL's ``BaseTool`` (``verl/tools/base_tool.py``). A tool written for veRL runs
with its imports pointed at :mod:`hybrid_rl.agents` (``BaseTool``, ``ToolResponse``,
``OpenAIFunctionToolSchema``); it need not subclass ours (a class with an ``async def execute`` is
accepted), ``create`` is called in both veRL's ``create_kwargs=`` shape and ours (:func:`call_create`),
and the schema is read by attribute (``self.tool_schema.function.name``). In short: one tool object
serves many trajectories, each trajectory gets its own *instance* (``create`` -> ``execute``* ->
``calc_reward`` -> ``release``), and every method is ``async`` (tools run concurrently,
:mod:`hybrid_rl.agents.executor`).

* ``create(instance_id=None, **kwargs) -> (instance_id, ToolResponse)``: kwargs are the row's
  ``extra_info.tools_kwargs[<tool name>]["create_kwargs"]`` (e.g. the ground truth), by name and as
  ``create_kwargs=``.
* ``execute(instance_id, parameters, **kwargs) -> (ToolResponse | str, step reward, metrics)``: one
  call with the model's parsed arguments; the text becomes the observation.
* ``calc_reward(instance_id) -> float``: the instance's reward at the end of the trajectory
  (veRL's agent loop never calls it; hybrid_rl adds it to the row's ``tool_rewards``).
* ``release(instance_id)``: free the instance.

Register a tool for notebooks and YAML with ``@register_tool("name")`` (as ``@register_reward``);
``tool_config_path`` YAML may also name any importable class by its dotted path.
"""

from __future__ import annotations

import inspect
import uuid
from typing import Any, Callable, Optional

from hybrid_rl.agents.schemas import OpenAIFunctionToolSchema, ToolResponse, as_tool_schema, schema_dict
from hybrid_rl.utils.registry import Registry, same_definition

__all__ = ["BaseTool", "ToolResponse", "call_create", "get_tool_cls", "register_tool", "registered_tools",
           "tool_method", "tool_schema_dict"]


class BaseTool:
    """A tool with per-trajectory instances; subclass and override ``execute`` (and the others as needed).

    Args:
        config: the ``config`` mapping of the tool's entry in the tool YAML (free-form).
        tool_schema: the OpenAI function schema shown to the model (a mapping or an
            :class:`OpenAIFunctionToolSchema`, read as ``self.tool_schema.function.name``); None =
            ``get_openai_tool_schema()``.
    """

    def __init__(self, config: Optional[dict] = None, tool_schema: Any = None):
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        self.tool_schema: OpenAIFunctionToolSchema = as_tool_schema(schema, f"tool {type(self).__name__}")
        self.name: str = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> Any:
        """The schema used when the YAML gives none (a mapping or an :class:`OpenAIFunctionToolSchema`);
        a tool without a default must be given one."""
        raise ValueError(f"tool {type(self).__name__} has no default schema: give it a tool_schema in the "
                         "tool config YAML, or override get_openai_tool_schema().")

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory; returns its id (and an optional opening response)."""
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse | str, float, dict]:
        """Run one call: (observation, step reward, metrics)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward when its trajectory ends."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free the instance."""


def class_registry(kind: str, config_key: str) -> Registry:
    """The registry of a family of classes named in YAML (tools, interactions, environments): a second
    class under a name raises in one line, the same class redefined (a re-run notebook cell) replaces it."""
    def duplicate(name: str, old: type, new: type) -> str:
        return f"{kind} {name!r} is already registered as {old.__module__}.{old.__qualname__}. Fix: pick another name."

    return Registry(kind, config_key, may_replace=same_definition, duplicate_error=duplicate)


_TOOLS = class_registry("tool", "actor_rollout_ref.rollout.multi_turn.tool_config_path: tools[].class_name")


def conforms(cls: Any, base: type, method: str) -> bool:
    """``cls`` is a ``base`` subclass, or a class of its own with an ``async def <method>`` (duck typing:
    a veRL tool subclasses veRL's base class, not ours)."""
    if not isinstance(cls, type):
        return False
    return issubclass(cls, base) or inspect.iscoroutinefunction(getattr(cls, method, None))


def registrar(registry: Registry, base: type, kind: str, name: str, method: str) -> Callable[[type], type]:
    """The class decorator behind ``@register_tool`` / ``@register_interaction``: adds a class that
    :func:`conforms` to ``base`` under ``name``; a second class under the same name raises (the same
    class redefined, e.g. a re-run notebook cell, replaces it)."""

    def decorator(cls: type) -> type:
        if not conforms(cls, base, method):
            raise ValueError(f"@register_{kind}({name!r}) decorates {cls!r}, which is neither a {base.__name__} "
                             f"subclass nor a class with an async {method}(). Fix: subclass "
                             f"hybrid_rl.agents.{base.__name__}.")
        return registry.add(name, cls)

    return decorator


def register_tool(name: str) -> Callable[[type], type]:
    """Class decorator: make a :class:`BaseTool` subclass available as ``class_name: <name>`` in the
    tool YAML. A second class under the same name raises (redefining the same class is allowed)."""
    return registrar(_TOOLS, BaseTool, "tool", name, "execute")


def registered_tools() -> list[str]:
    """Names registered with :func:`register_tool`."""
    return _TOOLS.names()


VERL_ALIASES: dict[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybrid_rl.agents.gsm8k_tool.Gsm8kTool",
}
"""veRL class paths that veRL's own example YAMLs name, and hybrid_rl's port of each: used only when the
``verl`` package is not installed, so veRL's ``gsm8k_tool_config.yaml`` runs unchanged."""


def import_object(path: str) -> Any:
    """The object a dotted path ``package.module.name`` names (veRL class paths of :data:`VERL_ALIASES`
    fall back to hybrid_rl's ports without ``verl``); ImportError / AttributeError / ValueError otherwise."""
    import importlib

    module_name, _, attr = str(path).rpartition(".")
    if not module_name:
        raise ValueError(f"{path!r} is not a dotted path (package.module.name)")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as exc:
        if exc.name not in ("verl", None) or path not in VERL_ALIASES:
            raise
        return import_object(VERL_ALIASES[path])


def import_class(class_name: str, base: type, method: str, where: str, kind: str, registered: list[str]) -> type:
    """``package.module.Class`` imported and checked to :func:`conform <conforms>` to ``base``;
    ValueError otherwise."""
    fix = (f"Fix: use a registered {kind} ({', '.join(registered) or 'none registered'}) or the dotted path of "
           f"an importable class with an async {method}(), e.g. my_pkg.module.MyClass")
    if not class_name.rpartition(".")[0]:
        raise ValueError(f"{where}: unknown {kind} class {class_name!r}. {fix}.")
    try:
        cls = import_object(class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{where}: cannot import {kind} class {class_name!r} ({type(exc).__name__}: {exc}). "
                         f"{fix}.") from None
    if not conforms(cls, base, method):
        raise ValueError(f"{where}: {class_name!r} is neither a {base.__name__} subclass nor a class with an "
                         f"async {method}(). {fix}.")
    return cls


def get_tool_cls(class_name: str, where: str) -> type:
    """A registered tool name, or a dotted import path ``package.module.Class``, resolved to the class."""
    if class_name in _TOOLS:
        return _TOOLS.get(class_name)
    return import_class(class_name, BaseTool, "execute", where, "tool", registered_tools())


def tool_schema_dict(tool: Any) -> dict[str, Any]:
    """The tool's schema as the plain mapping a chat template's ``tools=`` takes."""
    return schema_dict(tool.tool_schema)


def tool_method(tool: Any, name: str) -> Optional[Callable]:
    """The tool's ``create`` / ``calc_reward`` / ``release``, or None when a duck-typed tool lacks it
    (then the loop uses the default: a fresh id, reward 0, nothing to free)."""
    method = getattr(tool, name, None)
    return method if callable(method) else None


def call_create(tool: Any, create_kwargs: dict[str, Any]):
    """A coroutine of ``tool.create`` given the row's ``create_kwargs`` in both call shapes the method's
    signature accepts: veRL's agent loop passes ``create(create_kwargs={...})``, hybrid_rl's tools
    (and veRL's ``Gsm8kTool``, which reads ``ground_truth=`` first) take the keys as keyword arguments.
    Each key is passed by name when the signature takes it (or has ``**kwargs``), and the whole mapping
    as ``create_kwargs=`` when the signature names it or has ``**kwargs``."""
    create = tool_method(tool, "create")
    if create is None:
        async def fresh() -> tuple[str, ToolResponse]:
            return str(uuid.uuid4()), ToolResponse()
        return fresh()
    try:
        params = inspect.signature(create).parameters
    except (TypeError, ValueError):  # a C callable without a signature: veRL's shape
        return create(create_kwargs=create_kwargs)
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                         inspect.Parameter.KEYWORD_ONLY)}
    kwargs = {k: v for k, v in create_kwargs.items() if k in named or open_kwargs}
    kwargs.pop("instance_id", None)
    if "create_kwargs" in named or open_kwargs:
        kwargs["create_kwargs"] = dict(create_kwargs)
    return create(**kwargs)
