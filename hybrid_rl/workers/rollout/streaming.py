"""Streaming, interruptible generation (partial rollout), engine-neutral.

The producer of the decoupled mode submits requests (:class:`StreamRequest`), advances the engine a
little at a time (``stream_step``) and receives each sample (:class:`StreamSample`) as soon as it
finishes, instead of waiting for a whole batch's longest response. A weight update interrupts the
requests in flight (AReaL's interruptible rollout, veRL fully-async's partial rollout): every token
sampled so far is kept with its behaviour log-prob and the policy version that sampled it, the new
weights are loaded, and each request resumes from prompt + partial response as its new prompt with
the remaining token budget. Nothing is restarted; the KV cache of the resumed context is recomputed
with the new weights, so every later token is sampled by (and scored under) the new policy.

:class:`Streamer` is the default loop, serving the HF engine and any registered engine through the
engine's :meth:`~hybrid_rl.workers.rollout.base.BaseRollout.generate_turn`: each step generates a
segment of at most ``rollout.stream_segment_tokens`` tokens for every request in flight, so an
interrupt lands between segments. vLLM overrides the loop with continuous batching, one token per
engine step (``vllm_stream.py``).

Randomness: streamed sampling draws from the rollout's private stream (``rollout.seed``); a per-call
``seed`` in the parameters is not used, since requests join and leave the running batch at
different times and one call seed has no meaning for them.

Every type here is plain data (lists, ints, strings, dicts): picklable for Ray and a checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import torch

from hybrid_rl.workers.rollout.params import GenerationParams

if TYPE_CHECKING:
    from hybrid_rl.workers.rollout.base import BaseRollout

__all__ = ["PartialRequest", "StreamRequest", "StreamSample", "Streamer"]

FINISH_REASONS = ("stop", "length")


@dataclass
class StreamRequest:
    """One prompt to stream (one response; the producer repeats a prompt n times for GRPO)."""

    request_id: str
    """Unique among the requests in flight; the finished sample carries it back."""
    prompt_ids: list[int]
    """Unpadded prompt token ids (at most ``rollout.prompt_length``)."""
    max_tokens: int
    """Most response tokens (1..``rollout.response_length``)."""
    meta: dict = field(default_factory=dict)
    """Anything the producer needs back with the sample (uid, data row, ...), passed through."""


@dataclass
class StreamSample:
    """A finished response. ``versions[i]`` is the policy version whose weights sampled
    ``response_ids[i]``, and ``log_probs[i]`` its log-prob under those weights (the distribution it
    was sampled from, as ``rollout_log_probs``)."""

    request_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish_reason: str
    """``stop`` (ended with an EOS id of the parameters) or ``length`` (reached ``max_tokens``)."""
    meta: dict

    def staleness(self, current_version: int) -> int:
        """``current_version`` minus the version of the first response token (the choice the docs
        explain: the sample's oldest token decides how far off-policy it is)."""
        return current_version - self.versions[0]


@dataclass
class PartialRequest:
    """A request in flight: what has been sampled so far, token by token."""

    request: StreamRequest
    params: GenerationParams
    response_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        """The prompt a (re)started generation continues from: prompt + partial response."""
        return self.request.prompt_ids + self.response_ids

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - len(self.response_ids)

    def extend(self, tokens: Sequence[int], log_probs: Sequence[float], version: int) -> None:
        """Append newly sampled tokens, all sampled by ``version``'s weights."""
        assert len(tokens) == len(log_probs), f"{len(tokens)} tokens but {len(log_probs)} log-probs"
        self.response_ids.extend(int(t) for t in tokens)
        self.log_probs.extend(float(lp) for lp in log_probs)
        self.versions.extend([version] * len(tokens))

    def finish_reason(self) -> Optional[str]:
        """``stop`` after an EOS id, ``length`` at ``max_tokens``, None while it continues."""
        if self.response_ids and self.response_ids[-1] in self.params.eos_token_ids:
            return "stop"
        return "length" if self.remaining <= 0 else None

    def to_sample(self, reason: str) -> StreamSample:
        r = self.request
        return StreamSample(r.request_id, list(r.prompt_ids), self.response_ids, self.log_probs, self.versions,
                            reason, r.meta)

    def to_state(self) -> dict:
        return {"request": dataclasses.asdict(self.request), "params": dataclasses.asdict(self.params),
                "response_ids": list(self.response_ids), "log_probs": list(self.log_probs),
                "versions": list(self.versions)}

    @classmethod
    def from_state(cls, state: dict) -> "PartialRequest":
        params = dict(state["params"], eos_token_ids=tuple(state["params"]["eos_token_ids"]))
        return cls(StreamRequest(**state["request"]), GenerationParams(**params), list(state["response_ids"]),
                   list(state["log_probs"]), list(state["versions"]))


def check_stream_requests(rollout: "BaseRollout", requests: Sequence[StreamRequest],
                          in_flight: Iterable[str], agents: bool = False) -> None:
    """Refuse, in one line each, what streaming cannot serve (see docs/rollout.md); ``agents``: the
    requests are agent rows of :class:`~hybrid_rl.workers.rollout.agent_stream.AgentStreamer`."""
    cfg = rollout.config
    if rollout.multi_turn is not None and not agents:
        raise ValueError("stream_submit: this engine runs rows through agent loops (rollout.multi_turn or "
                         "rollout.agent is on) and streaming serves single-turn rows only. Fix: turn the agent "
                         "loops off for streaming, or use generate_sequences.")
    if not cfg.calculate_log_probs:
        raise ValueError("stream_submit: rollout.calculate_log_probs is false, but streamed samples carry each "
                         "token's behaviour log-prob. Fix: set rollout.calculate_log_probs=true.")
    seen = set(in_flight)
    for req in requests:
        if not isinstance(req, StreamRequest):
            raise TypeError(f"stream_submit: got a {type(req).__name__}, not a StreamRequest. Fix: wrap each "
                            "prompt as StreamRequest(request_id, prompt_ids, max_tokens, meta).")
        rid = req.request_id
        if rid in seen:
            raise ValueError(f"stream_submit: request_id {rid!r} is already in flight or repeated in this call. "
                             "Fix: give every request a unique id.")
        seen.add(rid)
        if not req.prompt_ids or len(req.prompt_ids) > cfg.prompt_length:
            raise ValueError(f"stream_submit: request {rid!r} has a {len(req.prompt_ids)}-token prompt; it must "
                             f"have 1..rollout.prompt_length={cfg.prompt_length} tokens. Fix: truncate or filter "
                             "the prompt, or raise rollout.prompt_length.")
        if not 1 <= req.max_tokens <= cfg.response_length:
            raise ValueError(f"stream_submit: request {rid!r} asks max_tokens={req.max_tokens}; it must be in "
                             f"1..rollout.response_length={cfg.response_length}. Fix: lower max_tokens or raise "
                             "rollout.response_length.")


class Streamer:
    """The in-flight requests of one engine and the default segment loop (see the module docstring).

    Not thread-safe: call it from one thread (a Ray actor runs its methods one at a time), so a
    weight update always lands between two steps.
    """

    def __init__(self, rollout: "BaseRollout"):
        self.rollout = rollout
        self.version = 0
        """The policy version of the weights the engine holds now."""
        self.in_flight: dict[str, PartialRequest] = {}

    def submit(self, requests: Sequence[StreamRequest], params: GenerationParams) -> None:
        check_stream_requests(self.rollout, requests, self.in_flight)
        for req in requests:
            copy = StreamRequest(req.request_id, [int(t) for t in req.prompt_ids], int(req.max_tokens),
                                 dict(req.meta))
            self.in_flight[req.request_id] = PartialRequest(copy, params)

    def pending(self) -> int:
        return len(self.in_flight)

    def step(self, max_wall_s: float) -> list[StreamSample]:
        """Advance until at least one request finished or ``max_wall_s`` passed (at least one
        advance per call); returns the finished samples, which leave the engine."""
        if not max_wall_s >= 0:
            raise ValueError(f"stream_step: max_wall_s={max_wall_s!r} is invalid: it is a time budget. "
                             "Fix: pass a non-negative number of seconds.")
        deadline = time.monotonic() + max_wall_s
        finished: list[StreamSample] = []
        while self.in_flight and not finished:
            self.rollout.check_ready()
            finished = self.advance()
            if time.monotonic() >= deadline:
                break
        return finished

    def advance(self) -> list[StreamSample]:
        """One segment of at most ``rollout.stream_segment_tokens`` tokens for every request in
        flight, through ``generate_turn`` (one call per parameter set)."""
        segment = self.rollout.config.stream_segment_tokens
        groups: dict[GenerationParams, list[PartialRequest]] = {}
        for partial in self.in_flight.values():
            groups.setdefault(partial.params, []).append(partial)
        for params, partials in groups.items():
            turns = self.rollout.generate_turn([p.context for p in partials],
                                               [min(segment, p.remaining) for p in partials],
                                               dataclasses.replace(params, seed=None))
            for partial, (tokens, log_probs) in zip(partials, turns):
                assert tokens, f"generate_turn returned no token for request {partial.request.request_id!r}"
                partial.extend(tokens, log_probs, self.version)
        return self.collect_finished()

    def collect_finished(self) -> list[StreamSample]:
        """Remove and return the requests that ended (EOS or max_tokens), in submission order."""
        done = [(rid, p.finish_reason()) for rid, p in self.in_flight.items()]
        return [self.in_flight.pop(rid).to_sample(reason) for rid, reason in done if reason is not None]

    def interrupt(self) -> None:
        """Stop generating the requests in flight, keeping every token sampled so far. The segment
        loop runs nothing between steps, so there is nothing to stop."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Interrupt, load the weights, and tag every later token with ``version``; the requests
        resume at the next step from the tokens already sampled."""
        self.load(lambda: self.rollout.update_weights(named_tensors), version)

    def load(self, load: Callable[[], None], version: int) -> None:
        """:meth:`update_weights` with the engine's own load ``load()`` (e.g. a trainer push through
        vLLM's weight-transfer protocol, ``BaseRollout.load_weight_push``)."""
        self._check_version(version, "stream_update_weights")
        self.interrupt()
        load()
        self.version = int(version)

    def set_version(self, version: int) -> None:
        self._check_version(version, "stream_set_version")
        self.version = int(version)

    def _check_version(self, version: Any, caller: str) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < self.version:
            raise ValueError(f"{caller}: version={version!r} is invalid: versions are integers that never go "
                             f"below the current one ({self.version}). Fix: pass the trainer's policy version.")

    def state(self) -> dict:
        """The requests in flight and the current version, as plain data (for a checkpoint)."""
        return {"version": self.version, "requests": [p.to_state() for p in self.in_flight.values()]}

    def restore(self, state: dict) -> None:
        """Put a :meth:`state` back in flight; they continue from their partial responses."""
        if self.in_flight:
            raise ValueError(f"stream_restore: {len(self.in_flight)} requests are in flight. Fix: restore into "
                             "an idle engine (stream_pending() == 0), e.g. right after it is built.")
        self.version = int(state["version"])
        for item in state["requests"]:
            partial = PartialRequest.from_state(item)
            self.in_flight[partial.request.request_id] = partial
