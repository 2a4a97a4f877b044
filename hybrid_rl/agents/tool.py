"""Tools a multi-turn rollout can call: the base class, the response type and the registry.

The interface is veRL's ``BaseTool`` (``verl/tools/base_tool.py``), so a veRL tool's methods port
unchanged: one tool object serves many trajectories, each trajectory gets its own *instance*
(``create`` -> ``execute``* -> ``calc_reward`` -> ``release``), and every method is ``async`` (tools
run concurrently, :mod:`hybrid_rl.agents.executor`).

* ``create(instance_id, **kwargs) -> (instance_id, ToolResponse)``: kwargs are the row's
  ``extra_info.tools_kwargs[<tool name>]["create_kwargs"]`` (e.g. the ground truth).
* ``execute(instance_id, parameters, **kwargs) -> (ToolResponse | str, step reward, metrics)``: one
  call with the model's parsed arguments; the text becomes the observation.
* ``calc_reward(instance_id) -> float``: the instance's reward at the end of the trajectory
  (veRL's agent loop never calls it; hybrid_rl adds it to the row's ``tool_rewards``).
* ``release(instance_id)``: free the instance.

Register a tool for notebooks and YAML with ``@register_tool("name")`` (as ``@register_reward``);
``tool_config_path`` YAML may also name any importable class by its dotted path.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["BaseTool", "ToolResponse", "get_tool_cls", "register_tool", "registered_tools", "check_tool_schema"]


@dataclass
class ToolResponse:
    """What a tool returns to the model (veRL's ``ToolResponse``; text only here)."""

    text: Optional[str] = None
    """The observation text (None = empty)."""


def check_tool_schema(schema: Any, where: str) -> dict[str, Any]:
    """Validate an OpenAI function-tool schema (``{"type": "function", "function": {"name", "description",
    "parameters"}}``) and return it as a plain dict; ValueError naming ``where`` otherwise."""
    fix = ("Fix: write it as {type: function, function: {name: ..., description: ..., parameters: "
           "{type: object, properties: {...}, required: [...]}}} (OpenAI function-calling schema)")
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise ValueError(f"{where}: the tool schema must be a mapping with type 'function' and a 'function' "
                         f"mapping, got {schema!r:.200}. {fix}.")
    function = schema["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: the tool schema has no function.name. {fix}.")
    params = function.get("parameters", {"type": "object", "properties": {}, "required": []})
    if not isinstance(params, dict) or params.get("type", "object") != "object" \
            or not isinstance(params.get("properties", {}), dict):
        raise ValueError(f"{where}: function.parameters of tool {name!r} must be a JSON-schema object "
                         f"with 'properties', got {params!r:.200}. {fix}.")
    return copy.deepcopy(schema)


class BaseTool:
    """A tool with per-trajectory instances; subclass and override ``execute`` (and the others as needed).

    Args:
        config: the ``config`` mapping of the tool's entry in the tool YAML (free-form).
        tool_schema: the OpenAI function schema shown to the model; None = ``get_openai_tool_schema()``.
    """

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        self.tool_schema = check_tool_schema(schema, f"tool {type(self).__name__}")
        self.name: str = self.tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> dict[str, Any]:
        """The schema used when the YAML gives none; a tool without a default must be given one."""
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


_TOOLS: dict[str, type] = {}


def registrar(registry: dict[str, type], base: type, kind: str, name: str) -> Callable[[type], type]:
    """The class decorator behind ``@register_tool`` / ``@register_interaction``: adds a ``base``
    subclass under ``name``; a second class under the same name raises (the same class redefined,
    e.g. a re-run notebook cell, replaces it)."""

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ValueError(f"@register_{kind}({name!r}) decorates {cls!r}, which is not a {base.__name__} "
                             f"subclass. Fix: subclass hybrid_rl.agents.{base.__name__}.")
        old = registry.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered as {old.__module__}.{old.__qualname__}. "
                             "Fix: pick another name.")
        registry[name] = cls
        return cls

    return decorator


def register_tool(name: str) -> Callable[[type], type]:
    """Class decorator: make a :class:`BaseTool` subclass available as ``class_name: <name>`` in the
    tool YAML. A second class under the same name raises (redefining the same class is allowed)."""
    return registrar(_TOOLS, BaseTool, "tool", name)


def registered_tools() -> list[str]:
    """Names registered with :func:`register_tool`."""
    return sorted(_TOOLS)


def _import_class(class_name: str, base: type, where: str, kind: str, registered: list[str]) -> type:
    """``package.module.Class`` imported and checked to subclass ``base``; ValueError otherwise."""
    import importlib

    module_name, _, attr = class_name.rpartition(".")
    fix = (f"Fix: use a registered {kind} ({', '.join(registered) or 'none registered'}) or the dotted path of "
           f"an importable {base.__name__} subclass, e.g. my_pkg.module.MyClass")
    if not module_name:
        raise ValueError(f"{where}: unknown {kind} class {class_name!r}. {fix}.")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{where}: cannot import {kind} class {class_name!r} ({type(exc).__name__}: {exc}). "
                         f"{fix}.") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: {class_name!r} is not a {base.__name__} subclass. {fix}.")
    return cls


def get_tool_cls(class_name: str, where: str) -> type:
    """A registered tool name, or a dotted import path ``package.module.Class``, resolved to the class."""
    if class_name in _TOOLS:
        return _TOOLS[class_name]
    return _import_class(class_name, BaseTool, where, "tool", registered_tools())
