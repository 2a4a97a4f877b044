"""Tool-call parsing from a model turn's text (``rollout.multi_turn.format``).

``hermes``: calls are ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5/3,
Hermes, and the format our built-in tasks teach). Departure from veRL's ``HermesToolParser``, which
logs and silently drops a block it cannot decode: here a malformed block becomes a
:class:`ToolCall` with an ``error``, which the rollout answers with an error observation (and counts),
so the model sees that its call failed and training can learn from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["TOOL_CALL_FORMATS", "ToolCall", "parse_hermes", "get_tool_parser"]

_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call; ``error`` is set (and name/arguments may be empty) when it could not be parsed."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


def _decode_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return ToolCall(error=f"the tool call is not valid JSON ({str(exc)[:80]})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(error='the tool call must be a JSON object with a "name" string and an "arguments" object')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=obj["name"], error='"arguments" must be a JSON object')
    return ToolCall(name=obj["name"], arguments=arguments)


def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order."""
    return [_decode_call(body.strip()) for body in _HERMES_RE.findall(text)]


TOOL_CALL_FORMATS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes}
"""Parsers by ``rollout.multi_turn.format`` name."""


def get_tool_parser(name: str) -> Callable[[str], list[ToolCall]]:
    """The parser for ``format``; ValueError naming the valid ones."""
    if name not in TOOL_CALL_FORMATS:
        raise ValueError(f"rollout.multi_turn.format={name!r} is invalid: must be one of {sorted(TOOL_CALL_FORMATS)}. "
                         "Fix: use hermes (<tool_call>{json}</tool_call>).")
    return TOOL_CALL_FORMATS[name]
