"""``POST /<key>/v1/messages``: Anthropic's Messages API over the same exact-id recording as chat completions.

A harness written with the official ``anthropic`` client (Claude-Code-style agents) points its
``base_url`` at the row's endpoint (:func:`anthropic_client` builds that client from the row's
``openai`` client). The request is translated into a chat request and served by
:meth:`~hybrid_rl.agents.openai_server.OpenAIEndpoint.chat_turn`, so it is recorded and continued exactly
as a chat completion is:

* ``system`` (a string or text blocks) -> a leading ``system`` message;
* a ``user`` turn's ``tool_result`` blocks -> ``tool`` messages (in block order), its ``text`` blocks ->
  one ``user`` message after them (blocks joined with a newline);
* an ``assistant`` turn's ``text`` blocks -> its content, its ``tool_use`` blocks -> ``tool_calls``;
* ``tools`` (client tools: ``name``, ``description``, ``input_schema``) -> the chat template's ``tools=``.

A request whose messages are an earlier call's messages, then that call's reply as returned (its text
and ``tool_use`` blocks), then new turns (the ``tool_result``) is continued from the earlier call's
exact ids; nothing sampled is decoded and re-encoded. The reply's blocks are the prose before the tool
calls (a ``text`` block) and one ``tool_use`` block per well-formed call; ``stop_reason`` is
``tool_use``, ``end_turn`` (the model's end-of-turn id), ``stop_sequence`` or ``max_tokens``.

``stop_sequences`` cut the completion after the token that completes one (vLLM's stop semantics: the
kept ids and log-probs are the engine's, tokens sampled past it are dropped); the sequence is not in the
returned text, and such a call is not continued (no end-of-turn id follows it), like one cut by
``max_tokens``. ``max_tokens`` is required (the row's response budget caps it); ``temperature``,
``top_p`` and ``top_k`` are applied (anthropic 2.x clients send them through ``extra_body``);
``metadata``, ``service_tier``, ``cache_control``, ``inference_geo`` and ``speed`` (hints to the
provider) are accepted and ignored, as are ``cache_control`` marks on blocks. Any
other field (``thinking``, ``stream=true``, server tools, images, an assistant prefill, a forced
``tool_choice``) is answered ``400`` in Anthropic's error shape, naming it.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, Optional

from hybrid_rl.agents.request_checks import InvalidParam, check_known_fields, check_route_body
from hybrid_rl.agents.schemas import chat_tool

if TYPE_CHECKING:
    from hybrid_rl.agents.openai_server import CallRecord, OpenAIEndpoint

__all__ = ["SUPPORTED_FIELDS", "anthropic_client", "chat_messages", "create_message"]

ROUTE = "/v1/messages"
SUPPORTED_FIELDS = frozenset({"model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p",
                              "top_k", "tools", "tool_choice", "metadata", "service_tier", "stream", "cache_control",
                              "inference_geo", "speed"})


def anthropic_client(client: Any, **kwargs: Any) -> Any:
    """An ``anthropic.AsyncAnthropic`` on the same row as ``client`` (the ``openai.AsyncOpenAI`` an
    :class:`~hybrid_rl.agents.openai_agent.OpenAIAgentLoop` agent is given); ``kwargs`` go to the
    client. Loopback calls never go through an HTTP(S)_PROXY."""
    import anthropic

    base = str(client.base_url).rstrip("/")
    timeout = kwargs.pop("timeout", 600.0)
    return anthropic.AsyncAnthropic(base_url=base[:-len("/v1")] if base.endswith("/v1") else base,
                                    api_key="hybrid-rl", max_retries=0, timeout=timeout,
                                    http_client=anthropic.DefaultAsyncHttpxClient(trust_env=False, timeout=timeout),
                                    **kwargs)


def _unsupported_block(where: str, kind: Any, allowed: str) -> InvalidParam:
    return InvalidParam(where, f"{where}.type={kind!r} is not supported by hybrid_rl's {ROUTE} ({allowed} blocks "
                               "only: the rollout is text-only). Fix: send the content as text.")


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParam(where, f"{where} must be a string or a list of content blocks. Fix: send text.")
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _unsupported_block(f"{where}[{j}]", kind, "text")
        parts.append(block["text"])
    return "\n".join(parts)


def _user_turn(content: Any, where: str) -> list[dict]:
    """A user turn: its ``tool_result`` blocks as ``tool`` messages, then its text as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list) or not content:
        raise InvalidParam(where, f"{where} must be a string or a non-empty list of blocks. Fix: send text.")
    tools, texts = [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result = block.get("content", "")
            tools.append({"role": "tool", "content": _text(result, f"{where}[{j}].content"),
                          "tool_call_id": str(block.get("tool_use_id", ""))})
        elif kind == "text":
            texts.append(_text([block], where))
        else:
            raise _unsupported_block(f"{where}[{j}]", kind, "text and tool_result")
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])


def _assistant_turn(content: Any, where: str) -> dict:
    """An assistant turn in chat form: its text, and its ``tool_use`` blocks as ``tool_calls``."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise InvalidParam(where, f"{where} must be a string or a list of blocks. Fix: send the reply as returned.")
    texts, calls = [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text([block], where))
        elif kind == "tool_use" and isinstance(block.get("input"), dict):
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block.get("name"), "arguments": json.dumps(block["input"])}})
        else:
            raise _unsupported_block(f"{where}[{j}]", kind, "text and tool_use")
    message = {"role": "assistant", "content": "\n".join(texts)}
    return {**message, "tool_calls": calls} if calls else message


def chat_messages(body: dict) -> list[dict]:
    """The chat messages of a Messages request (module docstring)."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns or not all(isinstance(m, dict) for m in turns):
        raise InvalidParam("messages", "'messages' must be a non-empty list of {role, content} objects. Fix: send "
                                       "at least one user turn.")
    out = [{"role": "system", "content": _text(body["system"], "system")}] if body.get("system") else []
    for i, turn in enumerate(turns):
        role, where = turn.get("role"), f"messages[{i}].content"
        if role == "user":
            out += _user_turn(turn.get("content"), where)
        elif role == "assistant" and i < len(turns) - 1:
            out.append(_assistant_turn(turn.get("content"), where))
        elif role == "assistant":
            raise InvalidParam(f"messages[{i}]", f"messages[{i}] is an assistant turn last (a prefill), which "
                                                 f"hybrid_rl's {ROUTE} does not continue. Fix: end with a user turn.")
        else:
            raise InvalidParam(f"messages[{i}].role", f"messages[{i}].role={role!r} is invalid: must be 'user' or "
                                                      "'assistant'. Fix: put system text in 'system'.")
    return out


def _tools(body: dict) -> tuple[Optional[list], bool]:
    """(the chat template's tools, whether the reply is read for tool calls)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidParam("tools", "'tools' must be a list of tools. Fix: send [{name, description, input_schema}].")
    try:
        converted = [chat_tool(t, "anthropic", f"tools[{i}]") for i, t in enumerate(tools or [])] or None
    except ValueError as exc:
        raise InvalidParam("tools", str(exc)) from None
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind not in (None, "auto", "none"):
        raise InvalidParam("tool_choice", f"tool_choice.type={kind!r} is not supported by hybrid_rl's {ROUTE}: the "
                                          "endpoint cannot force a tool call. Fix: send {\"type\": \"auto\"} and ask "
                                          "for the tool in the prompt.")
    return converted, bool(converted) and kind != "none"


def _check(body: dict) -> list[str]:
    """The request's checks (a 400 naming the field on the first failure); returns ``stop_sequences``."""
    check_known_fields(body, SUPPORTED_FIELDS, ROUTE)
    check_route_body(body, ROUTE, "max_tokens", limit_required=True)
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise InvalidParam("stop_sequences", f"stop_sequences={str(stop)[:60]} is invalid: must be a list of "
                                             "non-empty strings. Fix: send e.g. [\"</answer>\"].")
    return stop


async def create_message(endpoint: "OpenAIEndpoint", session: Any, body: dict) -> dict:
    """Serve one Messages request on ``session`` (a row's trajectory): Anthropic's ``Message`` object."""
    stop = _check(body)
    messages = chat_messages(body)
    tools, wants_calls = _tools(body)
    call, reply, parsed = await endpoint.chat_turn(session, messages, tools, body, wants_calls, stop=stop)
    content: list[dict] = []
    if reply["content"] or not parsed:
        content.append({"type": "text", "text": reply["content"]})
    for tool_call, parsed_call in zip(reply.get("tool_calls", []), parsed):
        tool_call["id"] = "toolu_" + tool_call["id"].removeprefix("call_")  # the stored reply keeps the same id
        content.append({"type": "tool_use", "id": tool_call["id"], "name": parsed_call.name,
                        "input": parsed_call.arguments})
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": body.get("model") or "hybrid_rl-policy", "content": content,
            "stop_reason": _stop_reason(call, bool(parsed)), "stop_sequence": call.stop_sequence,
            "usage": {"input_tokens": len(call.prompt_ids), "output_tokens": len(call.completion_ids)}}


def _stop_reason(call: "CallRecord", called: bool) -> str:
    if called:
        return "tool_use"
    return {"completed": "end_turn", "stop_sequence": "stop_sequence"}.get(call.stop_reason or "", "max_tokens")
