"""Tool-call parsing from a model turn's text (``rollout.multi_turn.format``).

``hermes``: calls are ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5/3,
Hermes, and the format our built-in tasks teach). ``llama3_json``: Llama 3.1+'s own format, the turn
is a JSON object ``{"name": ..., "parameters": {...}}`` (the names veRL's config lists). ``mistral``:
Mistral's ``[TOOL_CALLS]`` token, then a JSON list of ``{"name", "arguments"}`` (v3 tokenizers:
Mistral-7B-Instruct-v0.3, Nemo) or ``name[ARGS]{...}`` per call (v11+: Mistral Small 3.2, Magistral,
Devstral, with an optional ``[CALL_ID]id``), as vLLM's ``mistral`` tool parser reads them. The text
is decoded with special tokens kept, so the markers survive. Departure from veRL's ``HermesToolParser``, which
logs and silently drops a block it cannot decode: here a malformed block becomes a
:class:`ToolCall` with an ``error``, which the rollout answers with an error observation (and counts),
so the model sees that its call failed and training can learn from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from hybrid_rl.utils.registry import Registry

__all__ = ["TOOL_CALL_FORMATS", "ToolCall", "get_tool_parser", "parse_hermes", "parse_mistral", "text_before_calls"]

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


_LLAMA3_MARKERS = ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|end_of_text|>")


def parse_llama3_json(text: str) -> list[ToolCall]:
    """Llama 3.1-3.3's JSON tool calls: the whole turn is ``{"name": ..., "parameters": {...}}``
    (optionally after ``<|python_tag|>``, several separated by ``;``). A turn that does not start with
    ``{`` is a plain answer; one that does but does not decode is a malformed call."""
    body = text
    for marker in _LLAMA3_MARKERS:
        body = body.replace(marker, "")
    body = body.strip()
    if not body.startswith("{"):
        return []
    calls = []
    for part in (p.strip() for p in body.split(";")):
        if not part:
            continue
        try:
            obj = json.loads(part)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(error=f"the tool call is not valid JSON ({str(exc)[:80]})"))
            continue
        if isinstance(obj, dict) and "parameters" in obj and "arguments" not in obj:
            obj = {**obj, "arguments": obj["parameters"]}
        calls.append(_decode_call(json.dumps(obj)))
    return calls


MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_ARGS, _MISTRAL_CALL_ID = "[ARGS]", "[CALL_ID]"


def _first_json(text: str) -> Any:
    """The JSON value ``text`` starts with (anything after it, e.g. ``</s>``, is ignored)."""
    return json.JSONDecoder().raw_decode(text.lstrip())[0]


def _mistral_named_call(segment: str) -> ToolCall:
    """v11+: ``name[ARGS]{...}``, ``name[CALL_ID]id[ARGS]{...}`` or ``name{...}``."""
    if _MISTRAL_ARGS in segment:
        head, _, args = segment.partition(_MISTRAL_ARGS)
    else:
        cut = segment.find("{")
        head, args = (segment, "") if cut < 0 else (segment[:cut], segment[cut:])
    name = head.split(_MISTRAL_CALL_ID)[0].strip()
    if not name:
        return ToolCall(error="the tool call has no function name before its arguments")
    try:
        arguments = _first_json(args)
    except (json.JSONDecodeError, RecursionError) as exc:
        return ToolCall(name=name, error=f"the tool call's arguments are not valid JSON ({str(exc)[:80]})")
    return _decode_call(json.dumps({"name": name, "arguments": arguments}))


def parse_mistral(text: str) -> list[ToolCall]:
    """Every call after a ``[TOOL_CALLS]`` marker of ``text``, in order (see the module docstring): a
    segment that starts with ``[`` or ``{`` is v3's JSON, any other a v11+ named call."""
    calls: list[ToolCall] = []
    for segment in text.split(MISTRAL_TAG)[1:]:
        start = segment.lstrip()
        if not start.startswith(("[", "{")) or start.startswith((_MISTRAL_ARGS, _MISTRAL_CALL_ID)):
            calls.append(_mistral_named_call(segment))
            continue
        try:
            value = _first_json(segment)
        except (json.JSONDecodeError, RecursionError) as exc:
            calls.append(ToolCall(error=f"the tool call is not valid JSON ({str(exc)[:80]})"))
            continue
        for item in value if isinstance(value, list) else [value]:
            calls.append(_decode_call(json.dumps(item)))
    return calls


_FORMATS: Registry = Registry("tool-call format", "actor_rollout_ref.rollout.multi_turn.format")
for _name, _parser in (("hermes", parse_hermes), ("llama3_json", parse_llama3_json), ("mistral", parse_mistral)):
    _FORMATS.add(_name, _parser)

TOOL_CALL_FORMATS: Mapping[str, Callable[[str], list[ToolCall]]] = _FORMATS.entry_view()
"""Parsers by ``rollout.multi_turn.format`` name (a read-only view of the registry)."""

_CALLS_START = {"hermes": "<tool_call>", "mistral": MISTRAL_TAG}
"""Where a format's calls begin in a turn (``llama3_json``: the whole turn is the call)."""


def text_before_calls(name: str, text: str) -> str:
    """The prose of a turn that holds calls in format ``name``: what comes before them ("" for
    ``llama3_json``, whose calls are the whole turn)."""
    start = _CALLS_START.get(name)
    return text.split(start)[0].strip() if start else ""


def get_tool_parser(name: str) -> Callable[[str], list[ToolCall]]:
    """The parser for ``format``; ValueError naming the valid ones."""
    if name not in TOOL_CALL_FORMATS:
        raise ValueError(f"rollout.multi_turn.format={name!r} is invalid: must be one of {sorted(TOOL_CALL_FORMATS)}. "
                         "Fix: use hermes (<tool_call>{json}</tool_call>), llama3_json (Llama 3.1+) or mistral "
                         "([TOOL_CALLS]).")
    return TOOL_CALL_FORMATS[name]
