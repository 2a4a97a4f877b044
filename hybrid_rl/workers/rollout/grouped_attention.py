"""Decode attention for grouped-query models without copying the KV cache per query head.

With grouped-query attention (GQA: ``H`` query heads share ``H_kv`` key/value heads, ``G = H / H_kv``),
transformers' ``sdpa`` attention passes ``enable_gqa`` to SDPA only when there is no attention mask;
with one (left-padded prompts, a preallocated static cache) it first copies every layer's keys and
values ``G`` times (``repeat_kv``), at every decode step. That copy is ``G`` times the KV cache's
bytes per layer and step: on 2 CPU cores, SmolLM2-135M's shape (9 query heads, 3 KV heads), 64 rows
with a 384-position cache, one layer's decode attention takes 38 ms with the copy and 1.3 ms without
(fp32; bf16 4.8 ms and 1.3 ms).

A decode step has one query position, so the ``G`` query heads of a KV head can be folded into the
query-length axis instead: ``query [B, H, 1, D]`` is viewed as ``[B, H_kv, G, D]`` and attends to
``key/value [B, H_kv, L, D]`` under the same ``[B, 1, 1, L]`` mask, broadcast over the ``G`` rows. It is
the same attention (each query head still sees only its own KV head) by ordinary SDPA, with any
mask, on every device. Other calls (prefill, no mask, no groups, position biases) go to transformers'
own ``sdpa`` attention unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hybrid_rl.workers.varlen_attention import switchable_from_sdpa

GROUPED_DECODE_ATTENTION = "hybrid_rl_grouped_decode_sdpa"


def foldable(module: nn.Module, query: torch.Tensor, attention_mask: Optional[torch.Tensor],
             kwargs: dict) -> bool:
    """Whether this call is a grouped decode step that :func:`grouped_decode_attention_forward` folds:
    one query position, ``G > 1``, a ``[B, 1, 1, L]`` mask, and nothing transformers' path adds on top."""
    groups = getattr(module, "num_key_value_groups", 1)
    return (groups > 1 and query.shape[2] == 1 and attention_mask is not None and attention_mask.dim() == 4
            and attention_mask.shape[1] == 1 and kwargs.get("position_bias") is None
            and kwargs.get("cache") is None and not kwargs.get("output_attentions", False))


def grouped_decode_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                                     value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                     dropout: float = 0.0, scaling: Optional[float] = None,
                                     **kwargs) -> tuple[torch.Tensor, None]:
    """``query [B, H, q, D]``, ``key/value [B, H_kv, L, D]``, ``attention_mask [B, 1, q, L]`` (bool or
    additive, or None) -> ``([B, q, H, D], None)``, as transformers' ``sdpa`` attention returns it.

    A foldable call (:func:`foldable`: ``q == 1``) computes ``[B, H_kv, G, D]`` queries against the
    unrepeated keys; query head ``h`` belongs to KV head ``h // G``, the order ``repeat_kv`` uses.
    """
    if not foldable(module, query, attention_mask, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    folded = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # [B, H_kv, G, D]
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling)  # [B, H_kv, G, D]; the mask broadcasts over G
    return out.reshape(batch, 1, heads, -1), None  # the value head size may differ from the query's


def use_grouped_decode_attention(model: nn.Module) -> bool:
    """Switch an HF model from ``sdpa`` to :func:`grouped_decode_attention_forward` (other attention
    implementations are kept, and so are models whose attention does not go through transformers'
    attention interface: transformers would refuse with a console warning). Returns whether the model
    now uses it."""
    if not switchable_from_sdpa(model, GROUPED_DECODE_ATTENTION):
        return False
    model.set_attn_implementation(GROUPED_DECODE_ATTENTION)
    return model.config._attn_implementation == GROUPED_DECODE_ATTENTION


AttentionInterface.register(GROUPED_DECODE_ATTENTION, grouped_decode_attention_forward)
AttentionMaskInterface.register(GROUPED_DECODE_ATTENTION, sdpa_mask)
