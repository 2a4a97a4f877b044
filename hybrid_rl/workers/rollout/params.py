"""The sampling parameters of one ``generate_sequences`` call, resolved from the config and meta_info."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hybrid_rl.workers.rollout.config import RolloutConfig

__all__ = ["GenerationParams", "resolve_generation_params"]


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
