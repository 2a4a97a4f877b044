"""Attention over packed sequences without a ``[T, T]`` mask: one causal SDPA call per segment.

With ``use_remove_padding`` the valid tokens of a micro-batch are packed into one ``[1, T]`` row.
HF's ``sdpa`` then attends through a block-diagonal ``[T, T]`` mask: attention costs grow with
``T**2`` (the whole micro-batch) instead of the sum of the squared row lengths, and the CPU SDPA
kernels take their slow masked path. On GPUs veRL uses flash-attention's varlen kernel for this;
here the same thing is done with one ``is_causal`` SDPA call per packed row (``cu_seq_lens_q``,
the cumulative row lengths, is passed through the model call as in HF's flash-attention path).
Prefix-grouped layouts (:mod:`hybrid_rl.workers.packing`) pass ``packed_blocks`` instead: one
SDPA call per prompt group with a ``[L, L]`` mask in which each response attends to the group's
prompt and causally to itself.
Without either kwarg (the padded path) the function is exactly HF's ``sdpa`` attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN_ATTENTION = "hybrid_rl_varlen_sdpa"


@dataclass
class PackedBlock:
    """Packed positions ``[start, end)`` that attend only among themselves: causally when ``mask``
    is None, else as ``mask`` ``[L, L]`` bool (True = attend) says (a prefix-grouped prompt and its
    responses, see :mod:`hybrid_rl.workers.packing`)."""

    start: int
    end: int
    mask: Optional[torch.Tensor] = None


def _blocks_attention(query, key, value, blocks: list[PackedBlock], dropout: float,
                      scaling: Optional[float]) -> torch.Tensor:
    """``[1, H, T, D]`` attention output of a packed sequence made of ``blocks``."""
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    for b in blocks:
        outputs.append(F.scaled_dot_product_attention(
            query[:, :, b.start:b.end], key[:, :, b.start:b.end], value[:, :, b.start:b.end],
            attn_mask=b.mask, is_causal=b.mask is None, dropout_p=dropout, scale=scaling, enable_gqa=gqa))
    return torch.cat(outputs, dim=2)


def varlen_sdpa_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                  dropout: float = 0.0, scaling: Optional[float] = None,
                                  cu_seq_lens_q: Optional[torch.Tensor] = None,
                                  packed_blocks: Optional[list[PackedBlock]] = None, **kwargs
                                  ) -> tuple[torch.Tensor, None]:
    """``query [1, H, T, D]``, ``key/value [1, H_kv, T, D]`` -> ``([1, T, H, D], None)``.

    ``cu_seq_lens_q`` ``[num_rows + 1]`` (int) marks where each packed row starts; each row attends
    causally to itself only. ``packed_blocks`` (prefix-grouped layouts) describe the blocks
    instead. ``attention_mask`` is ignored in both cases (HF builds it from the positions).
    """
    if packed_blocks is None and cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    assert query.shape[0] == 1, "packed sequences come as one row"
    if packed_blocks is None:  # one causal block per packed row
        bounds = cu_seq_lens_q.tolist()
        packed_blocks = [PackedBlock(start, end) for start, end in zip(bounds[:-1], bounds[1:])]
    out = _blocks_attention(query, key, value, packed_blocks, dropout, scaling)  # [1, H, T, D]
    return out.transpose(1, 2).contiguous(), None


def cu_seq_lens(attention_mask: torch.Tensor) -> torch.Tensor:
    """Cumulative valid-token counts ``[B + 1]`` of the rows of ``attention_mask [B, L]``."""
    lengths = attention_mask.sum(-1)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def use_varlen_attention(module: nn.Module) -> bool:
    """Switch an HF model from ``sdpa`` to the varlen attention (other implementations are kept).

    Returns whether the model now uses it.
    """
    config = getattr(module, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", VARLEN_ATTENTION):
        return False
    module.set_attn_implementation(VARLEN_ATTENTION)
    return True


AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention_forward)
AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)
