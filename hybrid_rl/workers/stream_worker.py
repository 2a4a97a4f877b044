"""The rollout worker's streaming surface (the decoupled mode with ``async_training.partial_rollout=true``).

The driver's :class:`~hybrid_rl.trainer.ppo.stream_producer.StreamingProducer` hands requests to the rollout
workers (each rank its own share), pumps them with :meth:`stream_step` and loads new weights with
:meth:`stream_load_weights`, which interrupts the requests in flight, loads, and lets them continue from the
tokens already sampled (the engine's :meth:`~hybrid_rl.workers.rollout.base.BaseRollout.stream_update_weights`).
Requests and samples cross Ray as plain dicts of lists (no tensors).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from hybrid_rl.single_controller import Dispatch, register
from hybrid_rl.utils import faults
from hybrid_rl.workers.rollout.params import resolve_generation_params

__all__ = ["StreamingRolloutMixin"]


class StreamingRolloutMixin:
    """Streaming methods of a rollout-only worker (``self.rollout``, ``self.config.rollout``, ``self.tokenizer``
    and ``self._require`` come from the worker class)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def stream_submit(self, requests: list[dict[str, Any]], meta_info: dict[str, Any]) -> int:
        """Queue this rank's share of stream requests (``request_id``, ``prompt_ids``, ``max_tokens``,
        ``meta``) with the sampling parameters of ``meta_info`` (a training generate call's); returns how
        many requests this rank now has in flight."""
        from hybrid_rl.workers.rollout.streaming import StreamRequest

        self._require("rollout", "stream_submit")
        if requests:
            params = resolve_generation_params(self.config.rollout, meta_info, self.tokenizer)
            self.rollout.stream_submit([StreamRequest(**r) for r in requests], params)
        return self.rollout.stream_pending()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_step(self, max_wall_s: float) -> list[dict[str, Any]]:
        """Advance this rank's requests for at most ``max_wall_s`` (returning as soon as one finished); the
        finished samples as dicts (``request_id``, ``response_ids``, ``log_probs``, ``versions``, ...)."""
        self._require("rollout", "stream_step")
        return [asdict(sample) for sample in self.rollout.stream_step(max_wall_s)]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_load_weights(self, weights: Any, version: int) -> dict[str, float]:
        """Load a trainer push of ``version`` with the requests in flight interrupted and resumed (partial
        rollout), the engine's way (``load_weight_push``: vLLM's weight-transfer protocol on a rollout-only
        vLLM engine, the mapped buckets otherwise). Returns ``{"timing_s/weight_load": s}``."""
        self._require("rollout", "stream_load_weights")
        faults.inject("stream_load_weights", version)  # no-op unless HYBRID_RL_FAULT (tests): dies mid partial rollout
        start = time.perf_counter()
        self.rollout.stream_load_push(weights, version)  # as load_rollout_weights: vLLM's protocol where built
        return {"timing_s/weight_load": time.perf_counter() - start,
                "rollout/requests_in_flight_at_load": float(self.rollout.stream_pending())}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_state(self) -> dict[str, Any]:
        """This rank's requests in flight (partial responses, log-probs, versions) as plain data."""
        self._require("rollout", "stream_state")
        return self.rollout.stream_state()
