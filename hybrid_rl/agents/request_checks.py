"""The checks each agent's model call passes before it joins a batched engine round.

Agents choose their own sampling settings per call. A value the engine cannot sample with
(``top_p=-1``, ``temperature=NaN``) would otherwise fail the engine call that serves every row of the
round, and with it the step; a failure must stay the row's. So each call is checked on its own:

* the OpenAI-compatible endpoint (:mod:`hybrid_rl.agents.openai_server`) checks the whole request body
  with :func:`check_openai_body` and answers a bad one ``400`` in OpenAI's error shape
  (``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``), naming the parameter
  and its valid range;
* :class:`~hybrid_rl.agents.server.BatchingServer` checks the settings a custom agent loop passes to
  ``server_manager.generate`` with :func:`check_sampling`; the :class:`InvalidParam` it raises reaches
  that loop only.

The sampling ranges are OpenAI's or wider: ``temperature`` any finite number >= 0 (OpenAI: [0, 2]; 0
= greedy), ``top_p`` in [0, 1] as OpenAI (0 = greedy: only the most likely token is left, and the
engines, which refuse ``top_p=0``, are sent temperature 0 instead), ``top_k`` (vLLM's extension) -1, 0
or a positive count. ``n`` must be 1 and ``stream`` false (narrower than OpenAI: each sample is its own
call, and completions are recorded whole). Parameters the endpoint reads but does not apply (``stop``,
``seed``, the penalties, ``top_logprobs``) are checked against OpenAI's types and ranges too, so an
agent learns of a typo.

The Anthropic Messages and OpenAI Responses routes (:mod:`hybrid_rl.agents.anthropic_route`,
:mod:`hybrid_rl.agents.responses_route`) check their bodies with :func:`check_known_fields` (a field the
route does not honour is refused, by name, rather than silently ignored) and :func:`check_route_body`
(``stream``, the completion length limit, the sampling ranges above).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Mapping

__all__ = ["InvalidParam", "check_known_fields", "check_openai_body", "check_prompt_ids", "check_route_body",
           "check_sampling"]


class InvalidParam(ValueError):
    """A request parameter outside its valid range; ``param`` names it (OpenAI's error ``param``)."""

    code = "invalid_value"

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(param: str, value: Any, rule: str, fix: str) -> InvalidParam:
    return InvalidParam(param, f"{param}={_show(value)} is invalid: {rule}. Fix: {fix}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, Integral) or (isinstance(value, float) and value.is_integer())


def check_sampling(sampling: Mapping[str, Any], where: str = "") -> None:
    """InvalidParam unless ``temperature``, ``top_p`` and ``top_k`` (each optional, None = the
    rollout's own) are values the engines sample with. ``where`` prefixes the parameter's name."""
    temperature, top_p, top_k = (sampling.get(k) for k in ("temperature", "top_p", "top_k"))
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise _bad(where + "temperature", temperature, "must be a finite number >= 0 (0 = greedy)",
                   "send a temperature such as 1.0, or leave it out to sample at the rollout's temperature")
    if top_p is not None and not (_is_number(top_p) and 0 <= top_p <= 1):
        raise _bad(where + "top_p", top_p, "must be a number in [0, 1] (0 = greedy, 1 = no nucleus cut)",
                   "send a top_p in [0, 1], or leave it out to use the rollout's")
    if top_k is not None and not (_is_integer(top_k) and top_k >= -1):
        raise _bad(where + "top_k", top_k, "must be an integer >= -1 (-1 or 0 = no top-k cut)",
                   "send a positive top_k, -1 to disable it, or leave it out to use the rollout's")


def check_prompt_ids(ids: Any, vocab_size: int, param: str = "prompt") -> list[int]:
    """``ids`` as a list of ints, each in [0, vocab_size); InvalidParam naming ``param`` otherwise."""
    if not isinstance(ids, list) or not ids:
        raise InvalidParam(param, f"'{param}' must be a non-empty string or a non-empty list of token ids (one "
                                  "prompt per call). Fix: send the prompt text or its token ids.")
    for position, token in enumerate(ids):
        if not _is_integer(token) or not 0 <= token < vocab_size:
            raise _bad(f"{param}[{position}]", token, f"a token id must be an integer in [0, {vocab_size})",
                       "send ids of the policy's tokenizer, or the prompt as text")
    return [int(t) for t in ids]


def _check_counts(body: Mapping[str, Any]) -> None:
    """``n``, ``stream`` and the completion length limits."""
    if body.get("stream"):
        raise InvalidParam("stream", "stream=true is not supported: hybrid_rl records whole completions. "
                                     "Fix: stream=false")
    n = body.get("n")
    if n is not None and not (_is_integer(n) and n == 1):
        raise InvalidParam("n", f"n={_show(n)} is invalid: n must be 1 (each sample is its own call). Fix: call "
                                "the endpoint once per sample")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and not (_is_integer(value) and value >= 1):
            raise _bad(key, value, "must be an integer >= 1", f"send a positive {key}, or leave it out to "
                                                                "generate up to the row's response budget")


def _check_unapplied(body: Mapping[str, Any], kind: str) -> None:
    """Parameters read for their type only (OpenAI's ranges)."""
    logprobs = body.get("logprobs")
    if kind == "chat":
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("logprobs", logprobs, "must be true or false", "send logprobs=true for the sampled "
                                                                      "tokens' log-probs")
        top = body.get("top_logprobs")
        if top is not None and not (_is_integer(top) and 0 <= top <= 20):
            raise _bad("top_logprobs", top, "must be an integer in [0, 20]", "leave it out: the endpoint "
                                                                            "returns the sampled tokens' log-probs")
    elif logprobs is not None and not (isinstance(logprobs, bool) or (_is_integer(logprobs) and 0 <= logprobs <= 5)):
        raise _bad("logprobs", logprobs, "must be an integer in [0, 5]", "send logprobs=1 for the sampled "
                                                                         "tokens' log-probs")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and len(stop) <= 4
                                                           and all(isinstance(s, str) for s in stop))):
        raise _bad("stop", stop, "must be a string or a list of at most 4 strings",
                   "send stop as text (it is ignored: the model's end-of-turn ids end a completion)")
    for key in ("presence_penalty", "frequency_penalty"):
        value = body.get(key)
        if value is not None and not (_is_number(value) and -2 <= value <= 2):
            raise _bad(key, value, "must be a number in [-2, 2]", f"leave {key} out (it is not applied)")
    seed = body.get("seed")
    if seed is not None and not _is_integer(seed):
        raise _bad("seed", seed, "must be an integer", "leave seed out (the rollout's seed sets the sampling)")


def check_openai_body(body: Mapping[str, Any], kind: str) -> None:
    """InvalidParam on the first parameter of a ``chat`` or ``completions`` request body the endpoint
    cannot honour (module docstring)."""
    _check_counts(body)
    check_sampling(body)
    _check_unapplied(body, kind)


def check_known_fields(body: Mapping[str, Any], supported: Any, route: str) -> None:
    """InvalidParam naming the first top-level field of ``body`` that ``route`` does not support."""
    for key in body:
        if key not in supported:
            raise InvalidParam(key, f"{key!r} is not supported by hybrid_rl's {route} (supported: "
                                    f"{', '.join(sorted(supported))}). Fix: leave {key!r} out.")


def check_route_body(body: Mapping[str, Any], route: str, limit_key: str, limit_required: bool) -> None:
    """InvalidParam on ``stream=true``, a missing (when required) or non-positive ``limit_key`` (the
    completion length limit), or sampling settings outside the engines' ranges (:func:`check_sampling`)."""
    if body.get("stream"):
        raise InvalidParam("stream", f"stream=true is not supported by hybrid_rl's {route}: completions are "
                                     "recorded whole. Fix: stream=false")
    value = body.get(limit_key)
    if value is None and limit_required:
        raise InvalidParam(limit_key, f"{limit_key} is required by {route}. Fix: send {limit_key}, e.g. 1024 "
                                      "(the row's response budget caps it)")
    if value is not None and not (_is_integer(value) and value >= 1):
        raise _bad(limit_key, value, "must be an integer >= 1", f"send a positive {limit_key}")
    check_sampling(body)
