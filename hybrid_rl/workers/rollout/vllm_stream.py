"""Streaming with partial rollout on the in-process vLLM engine: continuous batching, one token per step.

The requests in flight are added to the ``LLMEngine`` behind ``VLLMRollout.llm``
(``llm_engine.add_request``) with ``output_kind=DELTA``; each ``llm_engine.step()`` runs one engine
core step (the scheduler admits new requests as others finish: continuous batching) and returns
the tokens each running request just sampled, with their log-probs. They are appended to the
request's partial response at once, tagged with the current policy version, so at any moment
between steps the partial responses hold everything the engine has sampled.

Interrupt (a weight update, a checkpoint's batch call): ``llm_engine.abort_request`` drops every
request in flight from the engine; the tokens are already ours. After the weights load
(``VLLMRollout.update_weights``, which also resets the prefix cache so no block computed with the
old weights is reused), each request is added again under a fresh engine id with prompt + partial
response as its prompt and the remaining ``max_tokens``: the prefill recomputes its KV cache with
the new weights and sampling continues where it stopped, at the token level.

Why not ``AsyncLLM``: in vLLM 0.32 it always talks to an engine core in a separate process
(``AsyncLLM.__init__`` builds ``EngineCoreClient.make_async_mp_client``, whatever
``VLLM_ENABLE_V1_MULTIPROCESSING`` says), so weights would have to cross a process boundary and
the colocated engine would no longer share the worker's memory and process group. The synchronous
``LLMEngine`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set by ``VLLMRollout``) runs the core in
this process (``InprocClient``) and exposes the same add/step/abort primitives.

Randomness and threads: each step runs inside the rollout's private stream (``self._rng.active()``,
no per-call seed: see ``streaming.py``) and with the worker's thread count, as ``VLLMRollout._generate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from hybrid_rl.workers.rollout.streaming import PartialRequest, StreamSample, Streamer

if TYPE_CHECKING:
    from hybrid_rl.workers.rollout.vllm_rollout import VLLMRollout

__all__ = ["VLLMStreamer"]


def _sampling_params(partial: PartialRequest, calculate_log_probs: bool) -> Any:
    """The request's remaining generation as vLLM ``SamplingParams`` (as ``VLLMRollout._generate``,
    but streaming deltas and no per-request seed)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = partial.params
    return SamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
        max_tokens=partial.remaining, ignore_eos=True, stop_token_ids=list(params.eos_token_ids),
        logprobs=0 if calculate_log_probs else None, detokenize=False, output_kind=RequestOutputKind.DELTA)


class VLLMStreamer(Streamer):
    """Continuous batching through ``VLLMRollout.llm.llm_engine`` (see the module docstring)."""

    rollout: "VLLMRollout"

    def __init__(self, rollout: "VLLMRollout"):
        super().__init__(rollout)
        self._engine_ids: dict[str, str] = {}  # engine request id -> our request id, while attached
        self._attached: dict[str, str] = {}  # our request id -> its engine request id
        self._next_id = 0

    def advance(self) -> list[StreamSample]:
        """Attach the requests not in the engine, run one engine step, record the tokens it sampled."""
        from hybrid_rl.workers.rollout.vllm_rollout import _threads

        engine = self.rollout.llm.llm_engine
        with self.rollout._rng.active(), _threads(self.rollout._num_threads):
            self._attach_waiting(engine)
            outputs = engine.step()
        for out in outputs:
            rid = self._engine_ids.get(out.request_id)
            if rid is None:  # not ours (none should run beside the stream)
                continue
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            steps = completion.logprobs or []
            assert len(steps) == len(tokens), f"{len(tokens)} tokens but {len(steps)} log-prob entries"
            self.in_flight[rid].extend(tokens, [step[tok].logprob for step, tok in zip(steps, tokens)], self.version)
            if out.finished:
                self._detach(rid)
        finished = self.collect_finished()
        for sample in finished:  # ended by our own rule (EOS id or max_tokens) while still attached
            if sample.request_id in self._attached:
                engine.abort_request([self._detach(sample.request_id)])
        return finished

    def _attach_waiting(self, engine: Any) -> None:
        from vllm.inputs import TokensPrompt

        for rid, partial in self.in_flight.items():
            if rid in self._attached:
                continue
            engine_id = f"{rid}@{self._next_id}"  # fresh per attach: an aborted id is never reused
            self._next_id += 1
            engine.add_request(engine_id, TokensPrompt(prompt_token_ids=partial.context),
                               _sampling_params(partial, self.rollout.config.calculate_log_probs))
            self._engine_ids[engine_id] = rid
            self._attached[rid] = engine_id

    def _detach(self, rid: str) -> Optional[str]:
        engine_id = self._attached.pop(rid, None)
        if engine_id is not None:
            self._engine_ids.pop(engine_id, None)
        return engine_id

    def interrupt(self) -> None:
        """Abort every attached request in the engine; their sampled tokens stay in flight here and
        they are attached again (prompt + partial) at the next step."""
        if not self._attached or self.rollout.llm is None:
            return
        engine_ids = list(self._attached.values())
        self._attached.clear()
        self._engine_ids.clear()
        self.rollout.llm.llm_engine.abort_request(engine_ids)
