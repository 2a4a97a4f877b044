"""Reading ``rollout.multi_turn.tool_config_path`` and ``interaction_config_path`` (veRL's YAML layouts).

Tools::

    tools:
      - class_name: calculator            # a @register_tool name, or a dotted path (veRL's form)
        config: {type: native}            # free-form, passed to the tool's constructor
        tool_schema:                      # OpenAI function schema; optional when the class has a default
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: {...}}}

Interactions::

    interaction:
      - name: gsm8k                       # chosen by the row's extra_info.interaction_kwargs.name
        class_name: my_pkg.MyInteraction  # a @register_interaction name or a dotted path
        config: {}

Only ``type: native`` tools are supported (veRL's ``mcp`` type needs MCP servers; it is refused
with that reason).
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from hybrid_rl.agents.interaction import BaseInteraction, get_interaction_cls
from hybrid_rl.agents.schemas import as_tool_schema
from hybrid_rl.agents.tool import BaseTool, get_tool_cls

__all__ = ["load_interactions", "load_tools"]

TOOL_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
INTERACTION_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def _read_yaml(path: str, key: str) -> Any:
    if not os.path.isfile(path):
        raise ValueError(f"{key}={path!r}: no such file. Fix: point it at a YAML file (see docs/agents.md).")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"{key}={path!r} is not valid YAML{line} ({getattr(exc, 'problem', exc)}). "
                         "Fix: check the indentation and quoting of that line.") from None


def _entries(path: str, key: str, top: str) -> list[tuple[str, str, dict]]:
    """``(where, class_name, entry)`` for each entry of the ``top:`` list of the YAML at ``path``."""
    data = _read_yaml(path, key)
    entries = data.get(top) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{key}={path!r} must hold a mapping with a '{top}:' list of entries, each with a "
                         "class_name. Fix: see the layout in docs/agents.md.")
    out = []
    for i, entry in enumerate(entries):
        where = f"{key}={path!r} {top}[{i}]"
        if not isinstance(entry.get("class_name"), str):
            raise ValueError(f"{where} has no class_name. Fix: add class_name: <registered name or dotted path>.")
        out.append((where, entry["class_name"], entry))
    return out


def load_tools(path: str) -> dict[str, BaseTool]:
    """Build every tool of the YAML at ``path``; returns ``{function name: tool}``."""
    tools: dict[str, BaseTool] = {}
    for where, class_name, entry in _entries(path, TOOL_KEY, "tools"):
        config = dict(entry.get("config") or {})
        if config.get("type", "native") != "native":
            raise ValueError(f"{where}: config.type={config['type']!r} is not supported (MCP tools need MCP "
                             "servers). Fix: use type: native with a BaseTool subclass.")
        cls = get_tool_cls(class_name, where)
        schema = entry.get("tool_schema")
        try:
            tool = cls(config=config, tool_schema=None if schema is None else as_tool_schema(schema, "tool_schema"))
            _check_loaded_tool(tool)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if tool.name in tools:
            raise ValueError(f"{where}: a second tool named {tool.name!r}. Fix: give each tool a distinct "
                             "function.name.")
        tools[tool.name] = tool
    return tools


def _check_loaded_tool(tool: Any) -> None:
    """A duck-typed tool (not a :class:`BaseTool`) must still carry a schema and a name; its schema is
    normalised so the rest of the rollout reads ``tool.tool_schema.function.name``."""
    if isinstance(tool, BaseTool):
        return
    schema = getattr(tool, "tool_schema", None)
    if schema is None:
        raise ValueError(f"tool {type(tool).__name__} has no tool_schema after construction. Fix: set "
                         "self.tool_schema in __init__ (veRL's BaseTool does) or give tool_schema in the YAML.")
    tool.tool_schema = as_tool_schema(schema, f"tool {type(tool).__name__}")
    name = getattr(tool, "name", None)
    tool.name = name if isinstance(name, str) and name else tool.tool_schema.function.name


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    """Build every interaction of the YAML at ``path``; returns ``{name: interaction}``. A missing name
    is derived from the class name as veRL does (``Gsm8kInteraction`` -> ``gsm8k``)."""
    interactions: dict[str, BaseInteraction] = {}
    for where, class_name, entry in _entries(path, INTERACTION_KEY, "interaction"):
        name = entry.get("name") or class_name.rpartition(".")[2].removesuffix("Interaction").lower()
        if name in interactions:
            raise ValueError(f"{where}: a second interaction named {name!r}. Fix: give each a distinct name.")
        cls = get_interaction_cls(class_name, where)
        interactions[name] = cls(config={**(entry.get("config") or {}), "name": name})
    return interactions
