"""The rollout interface shared by every engine, and the pieces the engines use.

Contract (docs/architecture.md): ``generate_sequences`` produces ONE response per input row (the
driver has already repeated each prompt ``n`` times); ``update_weights`` loads the actor's full
HF-named weights into the engine's own inference copy; ``sleep``/``wake_up`` release and restore
engine memory where the engine supports it.

The multi-turn and agent wiring is written once, here: :meth:`BaseRollout.generate_sequences`
checks the batch, resolves the sampling parameters and sends rows that run through agent loops to
the :class:`~hybrid_rl.workers.rollout.multi_turn.MultiTurnGenerator` built by
:meth:`BaseRollout.init_agents`, with the engine's :meth:`~BaseRollout.generate_turn` as its model.
An engine implements that generate primitive (and may override :meth:`~BaseRollout.generate_batch`
with a faster single-turn path) plus the weight and memory methods.

Streaming (``stream_*``): requests generate a step at a time and a weight update interrupts and
resumes them from the tokens already sampled (partial rollout); the loop lives in
:mod:`~hybrid_rl.workers.rollout.streaming` (engine-neutral, over :meth:`~BaseRollout.generate_turn`),
and an engine may bring its own through :meth:`~BaseRollout.make_streamer` (vLLM: continuous batching).

Randomness: each rollout owns a private random stream (:class:`PrivateRng`) that is swapped in
around engine calls, so generation never perturbs the trainer's torch/numpy/python RNG and the
engine's samples are reproducible from ``rollout.seed`` alone.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import numpy as np
import torch

from hybrid_rl.agents.config import agent_rollout_enabled
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.seeding import seed_everything
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from hybrid_rl.workers.rollout.params import GenerationParams, resolve_generation_params
from hybrid_rl.workers.rollout.sequences import build_rollout_output, check_prompt_batch, prompt_token_lists

if TYPE_CHECKING:
    from hybrid_rl.workers.rollout.streaming import StreamRequest, Streamer, StreamSample

__all__ = ["BaseRollout", "EngineRefusedModel", "GenerationParams", "PrivateRng", "ROW_SEED_STRIDE",
           "StrictWeightStream", "TurnResults", "data_parallel_rank", "expected_weight_shapes",
           "resolve_generation_params"]

TurnResults = list[tuple[list[int], list[float]]]
"""One ``(new token ids, their log-probs)`` per row of a :meth:`BaseRollout.generate_turn` call
(log-probs empty unless ``calculate_log_probs``)."""


class EngineRefusedModel(RuntimeError):
    """The engine's kernels cannot serve this model on this machine (``build_rollout`` falls back)."""


class BaseRollout(ABC):
    """A generation engine owned by the colocated actor/rollout worker."""

    name: str = ""
    """Engine name reported to the driver (``hf`` or ``vllm``)."""

    config: RolloutConfig
    """The engine's ``actor_rollout_ref.rollout`` settings (set by the engine's constructor)."""
    tokenizer: Any
    """The model's tokenizer (its EOS ids and chat template serve the agent loops)."""
    multi_turn: Optional[MultiTurnGenerator] = None
    """Runs rows through agent loops (:meth:`init_agents`); None: every row is one completion."""

    def init_agents(self) -> None:
        """Build the agent loops' generator when rows run through agent loops (multi-turn on, or the
        ``agent`` section names loops); an engine calls it at the end of its constructor, so a bad
        tool file or chat template fails when the engine is built."""
        if agent_rollout_enabled(self.config):
            self.multi_turn = MultiTurnGenerator(self.config, self.tokenizer,
                                                 getattr(self.tokenizer, "eos_token_id", None))

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One response per row of ``prompts`` (batch ``input_ids``/``attention_mask``/
        ``position_ids`` [B, P], left-padded). Returns ``prompts``, ``responses``,
        ``response_mask``, ``input_ids``/``attention_mask``/``position_ids`` [B, P+R] and optionally
        ``rollout_log_probs``; non-tensor batch and meta_info are passed through."""
        check_prompt_batch(prompts, self.config.prompt_length)
        self.check_ready()
        params = resolve_generation_params(self.config, prompts.meta_info, self.tokenizer)
        if self.multi_turn is not None:
            token_lists = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
            return self.multi_turn.generate(prompts, token_lists, params, self.generate_turn)
        return self.generate_batch(prompts, params)

    def check_ready(self) -> None:
        """Raise when the engine cannot generate now (asleep, weights not synced); default: it can."""

    @abstractmethod
    def generate_turn(self, token_lists: list[list[int]], max_tokens: list[int],
                      params: GenerationParams) -> TurnResults:
        """The generate primitive: one continuation per row of ``token_lists`` (unpadded prompt ids),
        in one engine call, each cut after its first EOS and at ``max_tokens[i]`` new tokens."""

    def generate_batch(self, prompts: DataProto, params: GenerationParams) -> DataProto:
        """Single-turn generation of the checked batch (layout: :meth:`generate_sequences`). Default:
        :meth:`generate_turn` over the unpadded prompts; an engine may override it with a faster path."""
        token_lists = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        turns = self.generate_turn(token_lists, [params.response_length] * len(token_lists), params)
        return build_rollout_output(prompts, [tokens for tokens, _ in turns], params,
                                    [lps for _, lps in turns] if self.config.calculate_log_probs else None)

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's full state dict (HF names, streamed one tensor at a time)."""

    def load_weight_push(self, handle: Any) -> None:
        """Load a trainer push (a ``WeightHandle`` of ``export_rollout_weights``): by default its
        mapped buckets streamed into :meth:`update_weights`; an engine may load it its own way."""
        from hybrid_rl.workers.weight_transfer import open_weights

        with open_weights(handle) as named_tensors:
            self.update_weights(named_tensors)

    release_weights_in_sleep: bool = False
    """Set by a worker whose every generation after a wake is preceded by ``update_weights`` when
    :attr:`needs_weights` says so (the hybrid engine's actor): ``sleep`` may then drop the weights."""

    @property
    def needs_weights(self) -> bool:
        """True when the engine holds no usable weights (dropped in ``sleep``, or a failed sync):
        ``update_weights`` must run before the next generation."""
        return False

    @abstractmethod
    def sleep(self) -> None:
        """Release engine memory while the trainer runs (no-op where unsupported)."""

    @abstractmethod
    def wake_up(self) -> None:
        """Restore what ``sleep`` released, before ``update_weights`` and generation."""

    @abstractmethod
    def shutdown(self) -> None:
        """Free the engine for good (the process and its process group stay usable)."""

    def memory_owners(self, seen: set) -> dict[str, int]:
        """Bytes this engine holds now, per owner (``rollout/weights``, ``rollout/kv_cache``),
        counted from its live tensors (:mod:`hybrid_rl.utils.memory`); storages already in
        ``seen`` are not counted again."""
        return {}

    # Streaming generation with partial rollout (hybrid_rl/workers/rollout/streaming.py, docs/rollout.md).
    _streamer: Optional["Streamer"] = None

    def make_streamer(self) -> "Streamer":
        """The streaming loop of this engine; default: segments through :meth:`generate_turn`."""
        from hybrid_rl.workers.rollout.streaming import Streamer

        return Streamer(self)

    def _stream(self) -> "Streamer":
        if self._streamer is None:
            self._streamer = self.make_streamer()
            if self.multi_turn is not None:  # agent rows: coroutines whose turns the engine's loop serves
                from hybrid_rl.workers.rollout.agent_stream import AgentStreamer

                self._streamer = AgentStreamer(self, self._streamer)
        return self._streamer

    def stream_submit(self, requests: list["StreamRequest"], params: GenerationParams) -> None:
        """Queue requests (agent rows when :attr:`multi_turn` is set, agent_stream.py); they generate
        during :meth:`stream_step`."""
        self._stream().submit(requests, params)

    def stream_step(self, max_wall_s: float) -> list["StreamSample"]:
        """Advance the requests in flight; return those that finished, as soon as at least one has
        (or ``max_wall_s`` passed: then possibly none)."""
        return self._stream().step(max_wall_s)

    def stream_update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Interrupt the requests in flight (their tokens kept), load the weights (:meth:`update_weights`),
        tag later tokens with ``version``; the requests resume from their partial responses."""
        self._stream().update_weights(named_tensors, version)

    def stream_load_push(self, handle: Any, version: int) -> None:
        """:meth:`stream_update_weights` for a trainer push (a ``WeightHandle``), loaded the engine's way
        (:meth:`load_weight_push`: vLLM's weight-transfer protocol on a rollout-only vLLM engine)."""
        self._stream().load(lambda: self.load_weight_push(handle), version)

    def stream_set_version(self, version: int) -> None:
        """The policy version of the weights the engine holds (the first sync's, or after a restore)."""
        self._stream().set_version(version)

    def stream_pending(self) -> int:
        """How many requests are in flight."""
        return 0 if self._streamer is None else self._streamer.pending()

    def stream_state(self) -> dict:
        """The requests in flight (partial responses, log-probs, versions) as plain data."""
        return self._stream().state()

    def stream_restore(self, state: dict) -> None:
        """Put a :meth:`stream_state` back in flight on an idle engine."""
        self._stream().restore(state)

    def stream_interrupt(self) -> None:
        """Stop generating the requests in flight, tokens kept (they resume at the next step); an
        engine calls it before a batch call that would otherwise run them too."""
        if self._streamer is not None:
            self._streamer.interrupt()


def data_parallel_rank(tensor_parallel_size: int = 1) -> int:
    """This process's data-parallel rank: ranks of one tensor-parallel group (consecutive global
    ranks) share it. 0 without torch.distributed."""
    import torch.distributed as dist

    return dist.get_rank() // tensor_parallel_size if dist.is_initialized() else 0


ROW_SEED_STRIDE = 1_000_003
"""Per-call seeds of DP rank r start at ``seed + r * ROW_SEED_STRIDE`` (distinct rows never share)."""


def _capture_rng(cuda: bool) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class PrivateRng:
    """The rollout's own torch/numpy/python random stream, swapped in around engine calls.

    vLLM in-process (and HF ``generate``) draw from the process-global generators, which the
    trainer also uses (dropout, shuffling). ``with rng.active():`` saves the trainer's state, loads
    the rollout's, and on exit stores the advanced rollout state and restores the trainer's.
    """

    def __init__(self, seed: int, cuda: bool = False):
        self._cuda = cuda
        outer = _capture_rng(cuda)
        seed_everything(seed)
        self._state = _capture_rng(cuda)
        _restore_rng(outer)

    @contextmanager
    def active(self, seed: Optional[int] = None) -> Iterator[None]:
        """Run the block on the private stream; with ``seed``, on a fresh stream seeded by it that
        is discarded afterwards (the private stream does not advance)."""
        outer = _capture_rng(self._cuda)
        if seed is None:
            _restore_rng(self._state)
        else:
            seed_everything(seed)
        try:
            yield
        finally:
            if seed is None:
                self._state = _capture_rng(self._cuda)
            _restore_rng(outer)


class StrictWeightStream:
    """Wraps a ``(name, tensor)`` stream, checking every name and shape against the expected
    state dict as it flows through; :meth:`check_complete` then reports names never received.

    ``expected`` maps each required name to its shape; ``optional`` names (tied-weight aliases
    such as ``lm_head.weight`` when tied to the embeddings) are accepted but not required.
    """

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                 expected: dict[str, torch.Size], optional: dict[str, torch.Size]):
        self._source = named_tensors
        self._expected = expected
        self._optional = optional
        self.seen: set[str] = set()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._source:
            shape = self._expected.get(name, self._optional.get(name))
            if shape is None:
                raise ValueError(f"update_weights: unexpected weight {name!r}: the rollout model has no "
                                 "such parameter. Fix: stream the actor's HF-named full state dict "
                                 "(e.g. FSDP full_state_dict) of the same architecture.")
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"update_weights: weight {name!r} has shape {tuple(tensor.shape)} but the "
                                 f"rollout model expects {tuple(shape)}. Fix: send full (unsharded) tensors.")
            self.seen.add(name)
            yield name, tensor

    def check_complete(self) -> None:
        missing = sorted(set(self._expected) - self.seen)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"update_weights: {len(missing)} weights were not sent ({shown}). Fix: stream "
                             "the full state dict; a partial update would leave the engine inconsistent.")


def expected_weight_shapes(model: torch.nn.Module) -> tuple[dict[str, torch.Size], dict[str, torch.Size]]:
    """(required, optional) name -> shape of an HF model's state dict. Parameters shared under two
    names (tied embeddings) are required under their first name and optional under the others."""
    state = model.state_dict(keep_vars=True)  # persistent buffers only, tied aliases included
    required = {name: p.shape for name, p in model.named_parameters()}
    required.update({name: b.shape for name, b in model.named_buffers() if name in state})
    optional = {name: t.shape for name, t in state.items() if name not in required}
    return required, optional
