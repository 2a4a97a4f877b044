"""``POST /<key>/v1/responses``: OpenAI's Responses API over the same exact-id recording as chat completions.

A harness written against the Responses API (Codex-style agents, the OpenAI Agents SDK) calls
``client.responses.create`` on the row's ``openai`` client. The request is translated into a chat
request and served by :meth:`~hybrid_rl.agents.openai_server.OpenAIEndpoint.chat_turn`:

* ``instructions`` -> a leading ``system`` message (not carried over by ``previous_response_id``, as
  OpenAI's API: send them on every call to continue a conversation exactly);
* ``input`` (a string, or items) -> chat messages: a ``message`` item (roles ``user``, ``assistant``,
  ``system``; ``developer`` is read as ``system``; ``input_text``/``output_text`` parts joined with a
  newline) -> a message; ``function_call`` items -> ``tool_calls`` of the assistant message they
  follow (or of a new one); ``function_call_output`` -> a ``tool`` message;
* ``previous_response_id`` -> that response's conversation (its input and its reply, kept per row until
  the rollout ends) followed by the new ``input``: the request then extends the earlier call and is
  continued from its exact ids (prompt ids + sampled ids + the template's delta for the new items);
  nothing sampled is decoded and re-encoded. Resending the whole conversation as ``input`` (``store:
  false`` style) is continued the same way.

The reply's ``output`` is a ``message`` item (the prose before the tool calls) and one
``function_call`` item per well-formed call (``call_id`` is what the ``function_call_output`` names);
``status`` is ``incomplete`` (``incomplete_details.reason: max_output_tokens``) when the completion was
cut by the length limit, ``completed`` otherwise. ``include: ["message.output_text.logprobs"]`` returns
the sampled tokens' log-probs. ``max_output_tokens``, ``temperature`` and ``top_p`` are applied;
``store``, ``metadata``, ``user`` and ``parallel_tool_calls`` are accepted (responses are always kept for
the row). Any other field (``reasoning``, ``stream=true``, built-in tools, images, ``truncation:
auto``, a forced ``tool_choice``) is answered ``400`` in OpenAI's error shape, naming it.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Optional

from hybrid_rl.agents.request_checks import InvalidParam, check_known_fields, check_route_body
from hybrid_rl.agents.schemas import chat_tool

if TYPE_CHECKING:
    from hybrid_rl.agents.openai_server import CallRecord, OpenAIEndpoint

__all__ = ["LOGPROBS", "SUPPORTED_FIELDS", "chat_input", "create_response"]

ROUTE = "/v1/responses"
LOGPROBS = "message.output_text.logprobs"
SUPPORTED_FIELDS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "previous_response_id",
                              "max_output_tokens", "temperature", "top_p", "store", "stream", "metadata", "user",
                              "parallel_tool_calls", "include", "truncation", "text"})
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of ``input_text`` / ``output_text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParam(where, f"{where} must be a string or a list of text parts. Fix: send text.")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise InvalidParam(f"{where}[{j}]", f"{where}[{j}].type={kind!r} is not supported by hybrid_rl's {ROUTE} "
                                                "(input_text and output_text parts only: the rollout is text-only). "
                                                "Fix: send the content as text.")
        parts.append(part["text"])
    return "\n".join(parts)


def _item(item: Any, where: str, out: list[dict]) -> None:
    """Append one input item's chat message to ``out`` (a function call joins the assistant turn before it)."""
    kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
    if kind == "message":
        role = _ROLES.get(item.get("role"))
        if role is None:
            raise InvalidParam(f"{where}.role", f"{where}.role={item.get('role')!r} is invalid: must be user, "
                                                "assistant, system or developer. Fix: send one of those roles.")
        out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call = {"id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        if out and out[-1]["role"] == "assistant":
            out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", []), call]}
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        out.append({"role": "tool", "content": _text(item.get("output"), f"{where}.output"),
                    "tool_call_id": str(item.get("call_id", ""))})
    else:
        raise InvalidParam(f"{where}.type", f"{where}.type={kind!r} is not supported by hybrid_rl's {ROUTE} "
                                            "(message, function_call and function_call_output items only). "
                                            "Fix: send those items, or previous_response_id for earlier turns.")


def chat_input(value: Any) -> list[dict]:
    """The chat messages of a request's ``input`` (module docstring)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidParam("input", "'input' must be a string or a non-empty list of items. Fix: send the user's "
                                    "text as input.")
    out: list[dict] = []
    for i, item in enumerate(value):
        _item(item, f"input[{i}]", out)
    return out


def _check(body: dict) -> bool:
    """The request's checks (a 400 naming the field on the first failure); returns whether log-probs are
    asked for."""
    check_known_fields(body, SUPPORTED_FIELDS, ROUTE)
    check_route_body(body, ROUTE, "max_output_tokens", limit_required=False)
    include = body.get("include") or []
    if not isinstance(include, list) or any(x != LOGPROBS for x in include):
        raise InvalidParam("include", f"include={str(include)[:60]} is not supported by hybrid_rl's {ROUTE}: only "
                                      f"{LOGPROBS!r}. Fix: leave the other values out.")
    if body.get("truncation") not in (None, "disabled"):
        raise InvalidParam("truncation", f"truncation={body['truncation']!r} is not supported: hybrid_rl never drops "
                                         "turns from a recorded conversation. Fix: truncation='disabled'.")
    text = body.get("text")
    kind = ((text or {}).get("format") or {}).get("type", "text") if isinstance(text, dict) else None
    if text is not None and kind != "text":
        raise InvalidParam("text", f"text.format.type={kind!r} is not supported by hybrid_rl's {ROUTE} (no "
                                   "structured outputs). Fix: leave 'text' out.")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise InvalidParam("instructions", "'instructions' must be a string. Fix: send the system text as a string.")
    return LOGPROBS in include


def _tools(body: dict) -> tuple[Optional[list], bool]:
    """(the chat template's tools, whether the reply is read for tool calls)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidParam("tools", "'tools' must be a list of tools. Fix: send [{type: function, name, parameters}].")
    try:
        converted = [chat_tool(t, "responses", f"tools[{i}]") for i, t in enumerate(tools or [])] or None
    except ValueError as exc:
        raise InvalidParam("tools", str(exc)) from None
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise InvalidParam("tool_choice", f"tool_choice={str(choice)[:60]} is not supported by hybrid_rl's {ROUTE}: "
                                          "the endpoint cannot force a tool call. Fix: send 'auto' and ask for the "
                                          "tool in the prompt.")
    return converted, bool(converted) and choice != "none"


def _history(session: Any, body: dict) -> list[dict]:
    """The conversation ``previous_response_id`` names (empty without one)."""
    previous = body.get("previous_response_id")
    if previous is None:
        return []
    if not isinstance(previous, str) or previous not in session.responses:
        raise InvalidParam("previous_response_id", f"previous_response_id={str(previous)[:60]!r} is not a response "
                                                   "of this row (responses are kept per row until its rollout ends). "
                                                   "Fix: send the id of a response this row's agent received, or the "
                                                   "whole conversation as input.")
    return list(session.responses[previous])


async def create_response(endpoint: "OpenAIEndpoint", session: Any, body: dict) -> dict:
    """Serve one Responses request on ``session`` (a row's trajectory): OpenAI's ``Response`` object."""
    wants_logprobs = _check(body)
    conversation = _history(session, body) + chat_input(body.get("input"))
    instructions = body.get("instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    tools, wants_calls = _tools(body)
    sampling = {**{k: body.get(k) for k in ("temperature", "top_p")}, "max_tokens": body.get("max_output_tokens")}
    call, reply, parsed = await endpoint.chat_turn(session, messages, tools, sampling, wants_calls)
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    session.responses[response_id] = [*conversation, reply]
    incomplete = call.stop_reason == "length" and not parsed
    output = _output(endpoint.tokenizer, call, reply, bool(parsed), wants_logprobs, incomplete)
    prompt, sampled = len(call.prompt_ids), len(call.completion_ids)
    return {"id": response_id, "object": "response", "created_at": time.time(), "model": body.get("model") or
            "hybrid_rl-policy", "status": "incomplete" if incomplete else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": instructions, "metadata": body.get("metadata") or {}, "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "previous_response_id": body.get("previous_response_id"),
            "max_output_tokens": body.get("max_output_tokens"), "store": body.get("store", True),
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": sampled,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + sampled}}


def _output(tokenizer: Any, call: "CallRecord", reply: dict, called: bool, wants_logprobs: bool,
            incomplete: bool) -> list[dict]:
    """The response's output items: the message (when it has text, or nothing else), then the calls."""
    items: list[dict] = []
    if reply["content"] or not called:
        text = {"type": "output_text", "text": reply["content"], "annotations": []}
        if wants_logprobs:
            values = call.log_probs or [0.0] * len(call.completion_ids)
            tokens = [tokenizer.decode([t]) for t in call.completion_ids]
            text["logprobs"] = [{"token": tok, "bytes": list(tok.encode()), "logprob": lp, "top_logprobs": []}
                                for tok, lp in zip(tokens, values)]
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant",
                      "status": "incomplete" if incomplete else "completed", "content": [text]})
    for tool_call in reply.get("tool_calls", []):
        items.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": tool_call["id"],
                      "name": tool_call["function"]["name"], "arguments": tool_call["function"]["arguments"],
                      "status": "completed"})
    return items
