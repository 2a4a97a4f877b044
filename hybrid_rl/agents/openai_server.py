"""An OpenAI-compatible endpoint over the rollout engine, recording every call's exact token ids.

During a rollout, black-box agents (any framework that speaks OpenAI's API) call
``POST /<key>/v1/chat/completions`` or ``/<key>/v1/completions`` on ``127.0.0.1``; ``<key>`` ties the
call to one row's trajectory (each row's client gets its own base URL). The endpoint (FastAPI on
uvicorn, one per rollout process, on a daemon thread) turns the request into prompt ids, sends them
to the row's :class:`~hybrid_rl.agents.server.BatchingServer` (batched with the other rows' calls),
and records the prompt ids, the sampled ids and their log-probs as the engine returned them.

Prompt ids, no decode and re-encode of sampled tokens: a chat request whose messages are an earlier
call's messages, then that call's reply (as the endpoint returned it), then new messages (tool results,
user turns) is continued from the earlier call's exact ids: its prompt ids + its sampled ids + the chat
template's delta for the new messages (``ObservationEncoder``); a call cut by ``max_tokens`` (``finish_reason``
``length``) is continued the same way, with the template's end-of-turn ids inserted after its sampled ids
(never its reply's text re-encoded). Any other request is templated afresh
(``apply_chat_template(messages, tools=...)``). Such a request *extends* the earlier call; the
trajectory row is built from the chain of extensions (docs/agents.md, "Black-box agents").

The same base URL serves Anthropic's ``/v1/messages`` (:mod:`hybrid_rl.agents.anthropic_route`) and
OpenAI's ``/v1/responses`` (:mod:`hybrid_rl.agents.responses_route`): each translates its request into
chat messages and is served by :meth:`OpenAIEndpoint.chat_turn`, so it is recorded and continued the
same way; bad requests are answered ``400`` in each API's error shape.

Each request is checked on its own before it joins a round (:mod:`hybrid_rl.agents.request_checks`):
a parameter out of range (``top_p=-1``, ``temperature=NaN``, ``max_tokens=0``, a token id outside the
vocabulary, ``stream=true``, ``n`` other than 1) is answered ``400`` in OpenAI's error shape naming
the parameter and its range, and the other rows' calls go on. A call the engine fails on alone is
answered ``500`` (``server_error``). ``temperature``, ``top_p``, ``top_k`` (vLLM's extension) and
``max_tokens`` / ``max_completion_tokens`` are applied; ``stop`` sequences are ignored (the model's
end-of-turn ids end a completion), as are ``seed`` and the penalties.
"""


import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from hybrid_rl.agents import anthropic_route, responses_route
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.parser import get_tool_parser, text_before_calls
from hybrid_rl.agents.request_checks import InvalidParam, check_openai_body, check_prompt_ids
from hybrid_rl.agents.server import RequestFailed

__all__ = ["CallRecord", "OpenAIEndpoint", "get_endpoint"]


@dataclass
class CallRecord:
    """One model call of a trajectory, as the engine saw it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: Optional[list[float]]
    stop_reason: Optional[str]
    messages: Optional[list[dict]] = None
    """The chat request's messages (None for /v1/completions)."""
    reply: Optional[dict] = None
    """The assistant message returned (what an agent sends back in its next request)."""
    parent: Optional[int] = None
    """Index of the call this one extends (its prompt starts with that call's ids), or None."""
    started: int = 0
    """The order in which the row's calls were requested."""
    stop_sequence: Optional[str] = None
    """The request's stop sequence that ended the completion (``stop_reason`` ``stop_sequence``), if any."""


@dataclass
class _Session:
    server_manager: Any
    sampling_params: dict
    requested: int = 0
    budget: Optional[int] = None
    """Most tokens after the first prompt of a chain (the row's response_length); None = no bound."""
    tool_format: str = "hermes"
    """The syntax of the model's tool calls (``rollout.multi_turn.format``), read into ``tool_calls``."""
    calls: list[CallRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    responses: dict[str, list[dict]] = field(default_factory=dict)
    """``/v1/responses``: each response id's conversation in chat form (for ``previous_response_id``)."""


_CONTINUED = ("completed", "length")
"""Stop reasons of calls a later request may continue: ended by an end-of-turn id, or cut by ``max_tokens``
(continued after the template's end-of-turn ids). A ``stop_sequence`` cut is not: its reply's text leaves the
sequence out, so the agent's history is not what was sampled, and a later request starts a new chain."""


class _RequestError(Exception):
    """A request the endpoint refuses (answered 400 with OpenAI's error shape)."""


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _same_message(sent: dict, returned: Optional[dict]) -> bool:
    """Whether ``sent`` (an assistant message in a request) is ``returned`` (a reply of ours)."""
    if returned is None or sent.get("role") != "assistant":
        return False

    def calls(message: dict) -> list:
        out = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            function = function if isinstance(function, dict) else {}
            arguments = function.get("arguments")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except json.JSONDecodeError:
                pass
            out.append((function.get("name"), arguments))
        return out

    return (sent.get("content") or "") == (returned.get("content") or "") and calls(sent) == calls(returned)


def cut_at_stop(tokenizer: Any, call: CallRecord, stop: Sequence[str]) -> Optional[str]:
    """Cut ``call``'s completion after the first token whose text completes one of ``stop`` (vLLM's stop
    semantics: the ids and log-probs kept are the engine's own, the tokens sampled past it are dropped);
    returns the sequence matched (its ``stop_reason`` becomes ``stop_sequence``), or None."""
    whole = tokenizer.decode(call.completion_ids, skip_special_tokens=True)
    if not any(s and s in whole for s in stop):
        return None
    for end in range(1, len(call.completion_ids) + 1):
        text = tokenizer.decode(call.completion_ids[:end], skip_special_tokens=True)
        found = [(text.find(s), s) for s in stop if s and s in text]
        if found:
            call.completion_ids = call.completion_ids[:end]
            call.log_probs = None if call.log_probs is None else call.log_probs[:end]
            call.stop_reason, call.stop_sequence = "stop_sequence", min(found)[1]
            return call.stop_sequence
    return None


class OpenAIEndpoint:
    """The endpoint of one rollout process (see the module docstring).

    Args:
        tokenizer: the rollout's tokenizer (chat template, decoding replies).
        host: the interface to listen on (loopback by default: agents run in this process or host).
    """

    def __init__(self, tokenizer: Any, host: str = "127.0.0.1"):
        self.tokenizer = tokenizer
        self.host = host
        self.encoder = ObservationEncoder(tokenizer, getattr(tokenizer, "eos_token", None) or "")
        self._end_of_turn_ids = list(tokenizer(self.encoder.end_of_turn, add_special_tokens=False)["input_ids"])
        self._sessions: dict[str, _Session] = {}
        self.port = _free_port(host)
        self._server = self._start()

    # ------------------------------------------------------------------ sessions
    def open(self, server_manager: Any, sampling_params: dict, budget: Optional[int] = None,
             tool_format: str = "hermes") -> str:
        """A new trajectory key whose calls go to ``server_manager``. ``budget``: the most tokens a chain
        of continued calls may add after its first prompt (a call is cut to what is left, as the
        in-process tool loop cuts its turns), so the row built from the chain is never truncated.
        ``tool_format``: how the model writes tool calls (``rollout.multi_turn.format``)."""
        get_tool_parser(tool_format)  # ValueError naming the formats
        key = uuid.uuid4().hex
        self._sessions[key] = _Session(server_manager, dict(sampling_params), budget=budget, tool_format=tool_format)
        return key

    def base_url(self, key: str) -> str:
        """The OpenAI base URL of a trajectory (``.../v1``)."""
        return f"http://{self.host}:{self.port}/{key}/v1"

    def close(self, key: str) -> list[CallRecord]:
        """End a trajectory: later calls with its key are refused; returns its calls in order."""
        session = self._sessions.pop(key, None)
        return [] if session is None else list(session.calls)

    # ------------------------------------------------------------------ requests
    def _session(self, key: str) -> _Session:
        session = self._sessions.get(key)
        if session is None:
            raise _RequestError(f"unknown or finished trajectory key {key!r}: use the base_url given to this row's agent")
        return session

    def _chat_prompt(self, session: _Session, messages: list, tools: Optional[list]) -> tuple[list[int], Optional[int]]:
        """(prompt ids, parent call) of a chat request: continued from an earlier call when it extends it."""
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _RequestError("'messages' must be a non-empty list of message objects")
        for index in range(len(session.calls) - 1, -1, -1):
            call = session.calls[index]
            n = len(call.messages or [])
            if (call.messages is not None and call.stop_reason in _CONTINUED and len(messages) > n + 1
                    and messages[:n] == call.messages and _same_message(messages[n], call.reply)):
                try:
                    delta = self.encoder.encode(messages[n + 1:])
                except Exception as exc:
                    raise _RequestError(f"the chat template cannot render the new messages ({type(exc).__name__}: "
                                        f"{str(exc)[:200]})") from None
                # a reply cut by max_tokens has no end-of-turn id: the template's is inserted (mask 0 in
                # the row), after the recorded ids, never after the reply's text re-encoded
                closing = self._end_of_turn_ids if call.stop_reason == "length" else []
                return call.prompt_ids + call.completion_ids + closing + delta, index
        try:
            rendered = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                          tokenize=False)
        except Exception as exc:  # jinja's TemplateError, a message without a role, ...
            raise _RequestError(f"the chat template cannot render these messages ({type(exc).__name__}: "
                                f"{str(exc)[:200]})") from None
        return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"]), None

    def _sampling(self, session: _Session, body: dict) -> dict:
        """The call's sampling settings: the row's, overridden by the request's (checked beforehand)."""
        sampling = dict(session.sampling_params)
        for key in ("temperature", "top_p", "top_k"):
            if body.get(key) is not None:
                sampling[key] = body[key]
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None:
            sampling["max_tokens"] = int(limit)
        return sampling

    async def chat(self, key: str, body: dict) -> dict:
        """``/v1/chat/completions``."""
        session = self._session(key)
        check_openai_body(body, "chat")
        messages, tools = body.get("messages"), body.get("tools")
        call, reply, parsed = await self.chat_turn(session, messages, tools, body,
                                                   bool(tools) and body.get("tool_choice") != "none")
        finish = "tool_calls" if parsed else ("stop" if call.stop_reason == "completed" else "length")
        choice = {"index": 0, "message": reply, "finish_reason": finish,
                  "logprobs": self._logprobs(call) if body.get("logprobs") else None}
        return self._envelope("chat.completion", body, choice, call)

    async def chat_turn(self, session: _Session, messages: list, tools: Optional[list], body: dict,
                        wants_calls: bool, stop: Sequence[str] = ()) -> tuple[CallRecord, dict, list]:
        """One model call of a chat conversation (every route's core): (the recorded call, the assistant
        message in chat form with ``tool_calls`` ids, the parsed calls). ``body``: the sampling settings
        (checked beforehand); ``stop``: sequences that end the completion (:func:`cut_at_stop`)."""
        prompt, parent = self._chat_prompt(session, messages, tools)
        call = await self._generate(session, prompt, self._sampling(session, body), parent)
        matched = cut_at_stop(self.tokenizer, call, stop) if stop else None
        reply, parsed = self._reply(session, call, wants_calls)
        if matched is not None:  # the stop sequence is not part of the returned text (Anthropic's rule)
            reply["content"] = reply["content"].split(matched, 1)[0]
        if parsed:
            reply["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed]
        call.messages, call.reply = [dict(m) for m in messages], reply
        return call, reply, parsed

    def _reply(self, session: _Session, call: CallRecord, wants_calls: bool) -> tuple[dict, list]:
        """(the assistant message, its well-formed tool calls) of a completion. The calls are parsed from
        the text with special tokens kept (Mistral's ``[TOOL_CALLS]`` is one); the content is the prose
        before them, without special tokens."""
        text = self.tokenizer.decode(call.completion_ids, skip_special_tokens=True)
        if not wants_calls:
            return {"role": "assistant", "content": text}, []
        raw = self.tokenizer.decode(call.completion_ids, skip_special_tokens=False)
        parsed = [c for c in get_tool_parser(session.tool_format)(raw) if c.error is None]
        if not parsed:
            return {"role": "assistant", "content": text}, []
        content = text_before_calls(session.tool_format, raw)
        for special in getattr(self.tokenizer, "all_special_tokens", ()):
            content = content.replace(special, "")
        return {"role": "assistant", "content": content.strip()}, parsed

    async def completions(self, key: str, body: dict) -> dict:
        """``/v1/completions`` (a prompt string, or token ids used exactly)."""
        session = self._session(key)
        check_openai_body(body, "completions")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        else:
            ids = prompt
        ids = check_prompt_ids(ids, len(self.tokenizer))
        call = await self._generate(session, ids, self._sampling(session, body), None)
        choice = {"index": 0, "text": self.tokenizer.decode(call.completion_ids, skip_special_tokens=True),
                  "finish_reason": "stop" if call.stop_reason == "completed" else "length",
                  "logprobs": {"tokens": [self.tokenizer.decode([t]) for t in call.completion_ids],
                               "token_logprobs": call.log_probs} if body.get("logprobs") is not None else None}
        return self._envelope("text_completion", body, choice, call)

    async def _generate(self, session: _Session, prompt: list[int], sampling: dict, parent: Optional[int]) -> CallRecord:
        if session.budget is not None:
            root = parent
            while root is not None and session.calls[root].parent is not None:
                root = session.calls[root].parent
            used = 0 if root is None else len(prompt) - len(session.calls[root].prompt_ids)
            if used >= session.budget:  # the new messages alone spend the row's budget: end the chain here
                return CallRecord(prompt_ids=list(prompt), completion_ids=[], log_probs=[], stop_reason="length")
            asked = sampling.get("max_tokens")  # 0 is a limit too
            sampling = {**sampling, "max_tokens": session.budget - used if asked is None
                        else min(asked, session.budget - used)}
        session.requested += 1
        started = session.requested
        out = await session.server_manager.generate(uuid.uuid4().hex, prompt_ids=prompt, sampling_params=sampling)
        call = CallRecord(prompt_ids=list(prompt), completion_ids=list(out.token_ids), log_probs=out.log_probs,
                          stop_reason=out.stop_reason, parent=parent, started=started)
        with session.lock:
            session.calls.append(call)
        return call

    def _logprobs(self, call: CallRecord) -> dict:
        values = call.log_probs or [0.0] * len(call.completion_ids)
        return {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                            for t, lp in zip(call.completion_ids, values)]}

    @staticmethod
    def _envelope(kind: str, body: dict, choice: dict, call: CallRecord) -> dict:
        prompt, completion = len(call.prompt_ids), len(call.completion_ids)
        return {"id": f"hybrid-rl-{uuid.uuid4().hex[:16]}", "object": kind, "created": int(time.time()),
                "model": body.get("model") or "hybrid_rl-policy", "choices": [choice],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}

    # ------------------------------------------------------------------ the server
    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        def error(status: int, kind: str, exc: Exception) -> JSONResponse:
            param, code = getattr(exc, "param", None), getattr(exc, "code", None)
            return JSONResponse({"error": {"message": str(exc), "type": kind, "param": param, "code": code}},
                                status_code=status)

        def anthropic_error(status: int, kind: str, exc: Exception) -> JSONResponse:  # Anthropic's error shape
            kind = "api_error" if status >= 500 else kind
            return JSONResponse({"type": "error", "error": {"type": kind, "message": str(exc)}}, status_code=status)

        async def answer(handler, key: str, request: Request, shape=error):
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise _RequestError("the request body must be a JSON object")
                return JSONResponse(await handler(key, body))
            except (_RequestError, InvalidParam, json.JSONDecodeError, ValueError) as exc:
                return shape(400, "invalid_request_error", exc)
            except RequestFailed as exc:  # not served: the engine failed on it alone, or the rollout ended
                return shape(500, "server_error", exc)

        @app.post("/{key}/v1/messages")
        async def messages(key: str, request: Request):
            return await answer(lambda k, b: anthropic_route.create_message(self, self._session(k), b), key,
                                request, anthropic_error)

        @app.post("/{key}/v1/responses")
        async def responses(key: str, request: Request):
            return await answer(lambda k, b: responses_route.create_response(self, self._session(k), b), key, request)

        @app.post("/{key}/v1/chat/completions")
        async def chat(key: str, request: Request):
            return await answer(self.chat, key, request)

        @app.post("/{key}/v1/completions")
        async def completions(key: str, request: Request):
            return await answer(self.completions, key, request)

        @app.get("/{key}/v1/models")
        async def models(key: str):
            return {"object": "list", "data": [{"id": "hybrid_rl-policy", "object": "model", "owned_by": "hybrid_rl"}]}

        return app

    def _start(self) -> Any:
        import uvicorn

        config = uvicorn.Config(self._app(), host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="hybrid_rl-openai-endpoint", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI-compatible endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return server

    def shutdown(self) -> None:
        """Stop serving (pending requests are dropped)."""
        self._server.should_exit = True


_ENDPOINTS: dict[int, OpenAIEndpoint] = {}


def get_endpoint(tokenizer: Any) -> OpenAIEndpoint:
    """This process's endpoint for ``tokenizer``, started on first use."""
    endpoint = _ENDPOINTS.get(id(tokenizer))
    if endpoint is None:
        endpoint = _ENDPOINTS[id(tokenizer)] = OpenAIEndpoint(tokenizer)
    return endpoint
