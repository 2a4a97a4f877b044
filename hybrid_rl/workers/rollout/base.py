"""The rollout interface shared by the HF and vLLM engines, and the pieces both engines use.

Contract (docs/architecture.md): ``generate_sequences`` produces ONE response per input row (the
driver has already repeated each prompt ``n`` times); ``update_weights`` loads the actor's full
HF-named weights into the engine's own inference copy; ``sleep``/``wake_up`` release and restore
engine memory where the engine supports it.

Randomness: each rollout owns a private random stream (:class:`PrivateRng`) that is swapped in
around engine calls, so generation never perturbs the trainer's torch/numpy/python RNG and the
engine's samples are reproducible from ``rollout.seed`` alone.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.seeding import seed_everything
from hybrid_rl.workers.rollout.config import RolloutConfig


class BaseRollout(ABC):
    """A generation engine owned by the colocated actor/rollout worker."""

    name: str = ""
    """Engine name reported to the driver (``hf`` or ``vllm``)."""

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One response per row of ``prompts`` (batch ``input_ids``/``attention_mask``/
        ``position_ids`` [B, P], left-padded). Returns ``prompts``, ``responses``,
        ``response_mask``, ``input_ids``/``attention_mask``/``position_ids`` [B, P+R] and optionally
        ``rollout_log_probs``; non-tensor batch and meta_info are passed through."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's full state dict (HF names, streamed one tensor at a time)."""

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


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters of one ``generate_sequences`` call, resolved from config + meta_info."""

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    """-1 = disabled."""
    seed: Optional[int]
    """Per-call seed from ``meta_info["seed"]``; None = continue the rollout's private stream."""
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    response_length: int


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def resolve_generation_params(config: RolloutConfig, meta_info: dict, tokenizer: Any) -> GenerationParams:
    """Training params (or ``val_kwargs`` when ``meta_info["validate"]``), with the per-call
    overrides the driver may set in meta_info: ``do_sample``, ``temperature``, ``seed``,
    ``eos_token_id``, ``pad_token_id``."""
    source = config.val_kwargs if meta_info.get("validate", False) else config
    do_sample = bool(meta_info.get("do_sample", source.do_sample))
    temperature = float(meta_info.get("temperature", source.temperature))
    if do_sample and temperature <= 0:
        raise ValueError(f"meta_info temperature={temperature} with do_sample=True is invalid: sampling "
                         "needs a positive temperature. Fix: pass do_sample=False for greedy decoding.")
    eos = _as_id_tuple(meta_info.get("eos_token_id", getattr(tokenizer, "eos_token_id", None)))
    if not eos:
        raise ValueError("no EOS token id: the tokenizer has no eos_token_id and meta_info has none. "
                         "Fix: set meta_info['eos_token_id'] or use a tokenizer with an EOS token.")
    pad = meta_info.get("pad_token_id", getattr(tokenizer, "pad_token_id", None))
    seed = meta_info.get("seed")
    return GenerationParams(
        do_sample=do_sample,
        temperature=temperature if do_sample else 0.0,
        top_p=float(source.top_p) if do_sample else 1.0,
        top_k=int(source.top_k) if do_sample else -1,
        seed=None if seed is None else int(seed),
        eos_token_ids=eos,
        pad_token_id=int(eos[0] if pad is None else pad),
        response_length=config.response_length,
    )


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
