"""``model.use_fused_kernels``: the LM head returns log-probs, so no ``[N, V]`` logits are ever held.

The model's own forward still runs (FSDP2's hooks, peft's adapters, the packed attention); only the
head's call is swapped for the duration of one forward: it receives the last hidden states, as
``lm_head`` does, and returns ``[..., 1]`` log-probs (``[..., 2]`` with the entropy) computed by
:func:`hybrid_rl.algorithms.linear_logits.linear_logprobs_and_entropy` from ``lm_head.weight``.
Because the swap happens inside the model's forward, the head's weight is the one FSDP2 gathered
for it, and the result is the model's output, where FSDP2 hooks its backward (veRL patches the
model's forward for its fused kernels; swapping the head's forward needs no copy of it).

Only model types whose forward passes the head's output through untouched qualify (no soft-capping,
no logit scale), with a plain bias-free ``nn.Linear`` head (a LoRA-wrapped head keeps the regular
path).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

from hybrid_rl.algorithms.linear_logits import linear_logprobs_and_entropy
from hybrid_rl.utils.profiling import phase

logger = logging.getLogger(__name__)

PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3"})
"""``config.model_type`` values whose causal-LM forward returns ``lm_head(hidden)`` unchanged as
the logits (checked in their transformers sources); other models keep the regular head."""


def fusable_head(module: nn.Module) -> Optional[nn.Linear]:
    """The LM head of ``module`` (an HF causal LM, possibly peft- or FSDP2-wrapped) when the fused
    path applies to it, else None."""
    config = getattr(module, "config", None)
    get_head = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if type(head) is not nn.Linear or head.bias is not None:
        return None
    return head if getattr(config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES else None


@contextmanager
def head_returns_log_probs(head: nn.Linear, labels: torch.Tensor, temperature: float,
                           entropy: Optional[str], drop_last: bool) -> Iterator[None]:
    """Within the block, ``head(hidden [B, L, H])`` returns ``[B, L', k]``: column 0 the log-prob of
    ``labels [B, L']`` under ``softmax(hidden @ W^T / temperature)``, column 1 the entropy when
    ``entropy`` is ``"metric"`` (no gradient) or ``"grad"``. ``drop_last``: the hidden states carry
    one more column than ``labels`` (the padded layout's last position), which is left out.
    """
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if drop_last:
            hidden = hidden[:, :-1]
        flat = hidden.reshape(-1, hidden.shape[-1])  # [B * L', H]
        with phase("log_probs"):  # nested in the model's range
            log_probs, ent = linear_logprobs_and_entropy(flat, head.weight, labels.reshape(-1),
                                                         temperature=temperature, entropy=entropy)
        columns = [log_probs] if ent is None else [log_probs, ent]
        # stacked last, so the output is no view (FSDP2 warns when a wrapped model returns a view)
        return torch.stack([c.view(hidden.shape[:-1]) for c in columns], dim=-1)

    own = head.__dict__.get("forward")  # an instance forward set by someone else comes back too
    head.forward = forward  # an instance attribute shadows the class's forward; removed below
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def entropy_mode(calculate_entropy: bool, entropy_grad: bool) -> Optional[str]:
    """``None`` (no entropy), ``"metric"`` (entropy without gradient) or ``"grad"``."""
    if not calculate_entropy:
        return None
    return "grad" if entropy_grad and torch.is_grad_enabled() else "metric"
