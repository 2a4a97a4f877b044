"""Attention over packed sequences without a ``[T, T]`` mask: each block attends only to itself.

With ``use_remove_padding`` the valid tokens of a micro-batch are packed into one ``[1, T]`` row.
HF's ``sdpa`` would then attend through a block-diagonal ``[T, T]`` mask: attention costs grow with
``T**2`` (the whole micro-batch) instead of the sum of the squared row lengths, and the CPU SDPA
kernels take their slow masked path. On GPUs veRL uses flash-attention's varlen kernel for this.
Here the blocks come from ``cu_seq_lens_q`` (the cumulative row lengths, HF's flash-attention
kwarg; each packed row attends causally to itself) or from a ``packed_layout`` built once per
forward by :mod:`hybrid_rl.workers.packing` (prefix-grouped layouts: a ``[L, L]`` mask per prompt
group in which each response attends to the group's prompt and causally to itself).
Without either kwarg (the padded path) the function is exactly HF's ``sdpa`` attention.

Small blocks (RL rows and prompt groups: a few hundred tokens) are computed all at once, as HF's
``eager`` attention does it: the blocks are gathered into a padded ``[n, H, L_max, D]`` batch,
and scores, a softmax (accumulating in fp32) and the weighted values are batched matmuls. On CPU
the SDPA backward has a large fixed cost per call and its masked path is slow (a micro-batch of 8
prompt groups of ~180 tokens, bf16, attention forward + backward over 30 layers: 1.1 s with one
SDPA call per group, 0.33 s batched). The batched form recomputes its ``n * H * L_max**2``
probabilities in backward rather than keeping them (:class:`_DenseBlockAttention`), but a layer's
scores still exist at once, so it is used only up to :data:`DENSE_MAX_SCORES`; larger layouts make
one SDPA call per block (flash attention, memory linear in the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hybrid_rl.utils.profiling import PREFIX, phase
from hybrid_rl.workers import attention_backend

VARLEN_ATTENTION = "hybrid_rl_varlen_sdpa"
#: The profiler range around each packed attention call (one per layer and forward).
PROFILE_LABEL = PREFIX + "packed_attention"

#: Most attention scores (blocks x heads x L_max**2) one layer computes in the batched form: its
#: scores and probabilities of one layer exist at once (2 bytes per score in bf16, ~16 MB), in the
#: forward and again in backward, which recomputes them.
DENSE_MAX_SCORES = 1 << 23


@dataclass
class PackedBlock:
    """Packed positions ``[start, end)`` that attend only among themselves: causally when ``mask``
    is None, else as ``mask`` ``[L, L]`` bool (True = attend) says (a prefix-grouped prompt and its
    responses, see :mod:`hybrid_rl.workers.packing`)."""

    start: int
    end: int
    mask: Optional[torch.Tensor] = None
    segments: Optional[tuple[int, ...]] = None
    """A prompt group's ``(prompt length, response lengths...)`` (what ``mask`` was built from:
    :func:`~hybrid_rl.workers.packing.group_mask`); the FlexAttention path reads these instead of
    the mask. None = one causal segment."""

    def flex_segments(self, first: int) -> list[tuple[int, Optional[int]]]:
        """This block's segments as ``(length, prefix segment index or None)``, numbered from
        ``first`` (:func:`hybrid_rl.workers.flex_attention.segment_ids`)."""
        if self.segments is None:
            assert self.mask is None, "a masked block names its segments"
            return [(self.end - self.start, None)]
        prompt, *responses = self.segments
        return [(prompt, None)] + [(n, first) for n in responses]


@dataclass
class DenseBlocks:
    """``n`` blocks of a packed ``[1, T]`` sequence laid out as a padded ``[n, L_max]`` batch."""

    gather: torch.Tensor
    """``[n * L_max]`` long: the packed position of each slot (a padding slot repeats a position of
    its block; no real query attends to it)."""
    scatter: torch.Tensor
    """``[T]`` long: the slot of each packed position."""
    bias: torch.Tensor
    """``[n, 1, 1, L_max, L_max]`` in the compute dtype: 0 where a query slot attends to a key
    slot, -inf elsewhere (a padding query slot attends to itself, so no softmax row is empty)."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.bias.shape[0], self.bias.shape[-1]


def dense_blocks(blocks: list[PackedBlock], device: torch.device, dtype: torch.dtype) -> DenseBlocks:
    """The :class:`DenseBlocks` of ``blocks``, which must tile ``[0, T)`` in order."""
    lengths = [b.end - b.start for b in blocks]
    assert all(a.end == b.start for a, b in zip(blocks, blocks[1:])) and blocks[0].start == 0
    n, width = len(blocks), max(lengths)
    slot = torch.arange(width, device=device)
    gather = torch.stack([b.start + slot.clamp(max=length - 1) for b, length in zip(blocks, lengths)])
    scatter = torch.cat([i * width + slot[:length] for i, length in enumerate(lengths)])
    attend = torch.eye(width, dtype=torch.bool, device=device).repeat(n, 1, 1)  # [n, L_max, L_max]
    for i, (b, length) in enumerate(zip(blocks, lengths)):
        attend[i, :length, :length] = b.mask if b.mask is not None else \
            torch.ones(length, length, dtype=torch.bool, device=device).tril()
    bias = torch.zeros(attend.shape, dtype=dtype, device=device).masked_fill_(~attend, float("-inf"))
    return DenseBlocks(gather.reshape(-1), scatter, bias[:, None, None])


def _dense_attention(query, key, value, dense: DenseBlocks, scaling: float) -> torch.Tensor:
    """``[1, T, H, D]`` attention of ``query [1, H, T, D]``, ``key/value [1, H_kv, T, D]`` over the
    padded blocks: batched matmuls and a softmax that accumulates in fp32 and writes the compute
    dtype (HF's eager attention rounds its fp32 softmax to that dtype too; fused kernels likewise).

    Query heads share key/value heads in HF's order (head ``h`` reads kv head ``h // (H / H_kv)``),
    so the ``H / H_kv`` query heads of a kv head are stacked along the rows instead of repeating
    the keys and values.
    """
    n, width = dense.shape
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    rep = heads // kv_heads
    q = (query[0] * scaling).index_select(1, dense.gather)  # [H, n * L_max, D]
    q = q.view(kv_heads, rep, n, width, dim).permute(2, 0, 1, 3, 4).reshape(n, kv_heads, rep * width, dim)
    k = key[0].index_select(1, dense.gather).view(kv_heads, n, width, dim).transpose(0, 1)  # [n, H_kv, L_max, D]
    v = value[0].index_select(1, dense.gather).view(kv_heads, n, width, dim).transpose(0, 1)
    out = _DenseBlockAttention.apply(q, k, v, dense.bias, rep)  # [n, H_kv, rep * L_max, D]
    out = out.view(n, heads, width, dim).transpose(1, 2).reshape(n * width, heads, dim)
    return out.index_select(0, dense.scatter).unsqueeze(0)  # [1, T, H, D]


def _block_probs(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, rep: int) -> torch.Tensor:
    """``softmax(q k^T + bias)`` ``[n, H_kv, rep * L, L]`` for ``q [n, H_kv, rep * L, D]`` (scaled),
    ``k [n, H_kv, L, D]`` and ``bias [n, 1, 1, L, L]`` (0 or -inf)."""
    n, kv_heads, rows, _ = q.shape
    width = k.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)).view(n, kv_heads, rep, width, width).add_(bias)
    return torch.softmax(scores, dim=-1).view(n, kv_heads, rows, width)


class _DenseBlockAttention(torch.autograd.Function):
    """``softmax(q k^T + bias) v`` that keeps ``q``, ``k``, ``v`` for backward and recomputes the
    probabilities there, as flash attention does: autograd would keep the ``n * H * L**2``
    probabilities of every layer until backward (SmolLM2, 16 prompt groups of 231 tokens: 15 MiB a
    layer, 460 MiB over 30 layers), here one layer's exist at a time. The recomputation is one
    batched matmul and a softmax per layer."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, rep: int) -> torch.Tensor:
        ctx.save_for_backward(q, k, v, bias)
        ctx.rep = rep
        return torch.matmul(_block_probs(q, k, bias, rep), v)  # [n, H_kv, rep * L, D]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, bias = ctx.saved_tensors
        probs = _block_probs(q, k, bias, ctx.rep)  # the forward's, bit for bit
        grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)  # [n, H_kv, L, D]
        grad_probs = torch.matmul(grad_out, v.transpose(-1, -2))  # [n, H_kv, rep * L, L]
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_q = torch.matmul(grad_scores, k)
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q)
        return grad_q, grad_k, grad_v, None, None


@dataclass
class PackedLayout:
    """The blocks of one packed forward, passed to the model as ``packed_layout`` and shared by
    all its layers, so the batched form is built once per forward."""

    blocks: list[PackedBlock]
    cu_seq_lens: Optional[torch.Tensor] = None
    """``[num_rows + 1]`` int32 row bounds when every block is a causal row (the varlen kernels'
    input); None for prompt-grouped layouts."""
    max_length: int = 0
    """The longest row (with ``cu_seq_lens``)."""
    _dense: Optional[DenseBlocks] = field(default=None, repr=False)
    _width: int = field(default=0, repr=False)
    _flex: Any = field(default=None, repr=False)

    @classmethod
    def from_cu_seq_lens(cls, cu_seq_lens_q: torch.Tensor) -> "PackedLayout":
        """One causal block per packed row (``cu_seq_lens_q [num_rows + 1]``)."""
        bounds = cu_seq_lens_q.tolist()
        blocks = [PackedBlock(start, end) for start, end in zip(bounds[:-1], bounds[1:]) if end > start]
        return cls(blocks, cu_seq_lens_q, max((b.end - b.start for b in blocks), default=0))

    @property
    def grouped(self) -> bool:
        """Whether some block is a prompt group (not a plain causal row)."""
        return any(b.mask is not None for b in self.blocks)

    def flex(self, device: torch.device) -> Any:
        """The FlexAttention block mask of this layout (:class:`~hybrid_rl.workers.flex_attention.FlexLayout`),
        built on first use and shared by every layer of the forward."""
        if self._flex is None:
            from hybrid_rl.workers.flex_attention import flex_layout

            segments: list[tuple[int, Optional[int]]] = []
            for block in self.blocks:
                segments += block.flex_segments(len(segments))
            self._flex = flex_layout(segments, device)
        return self._flex

    def dense(self, heads: int, device: torch.device, dtype: torch.dtype) -> Optional[DenseBlocks]:
        """The batched form, or None when its scores would exceed :data:`DENSE_MAX_SCORES`."""
        self._width = self._width or max(b.end - b.start for b in self.blocks)
        if len(self.blocks) * heads * self._width**2 > DENSE_MAX_SCORES:
            return None
        if self._dense is None or self._dense.bias.dtype != dtype:
            self._dense = dense_blocks(self.blocks, device, dtype)
        return self._dense


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
                                  packed_layout: Optional[PackedLayout] = None, **kwargs
                                  ) -> tuple[torch.Tensor, None]:
    """``query [1, H, T, D]``, ``key/value [1, H_kv, T, D]`` -> ``([1, T, H, D], None)``.

    ``cu_seq_lens_q`` ``[num_rows + 1]`` (int) marks where each packed row starts; each row attends
    causally to itself only. ``packed_layout`` (built once per forward by
    :mod:`hybrid_rl.workers.packing`; prefix-grouped layouts need it) describes the blocks instead.
    ``attention_mask`` is ignored in both cases (HF builds it from the positions).
    """
    if packed_layout is None and cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    assert query.shape[0] == 1, "packed sequences come as one row"
    with phase("packed_attention"):  # benchmarks/profile_update.py reads this range
        return _packed_attention(query, key, value, packed_layout or PackedLayout.from_cu_seq_lens(cu_seq_lens_q),
                                 dropout, scaling)


def _packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                      dropout: float, scaling: Optional[float]) -> tuple[torch.Tensor, None]:
    """The packed branch of :func:`varlen_sdpa_attention_forward`."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    choice = attention_backend.current_choice()
    kernel = choice.groups if layout.grouped else choice.rows
    if kernel != "sdpa" and dropout == 0.0:
        return _kernel_attention(kernel, query, key, value, layout, scaling), None
    dense = layout.dense(query.shape[1], query.device, query.dtype) if dropout == 0.0 else None
    if dense is not None:
        return _dense_attention(query, key, value, dense, scaling), None
    out = _blocks_attention(query, key, value, layout.blocks, dropout, scaling)  # [1, H, T, D]
    return out.transpose(1, 2).contiguous(), None


def _kernel_attention(kernel: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      layout: PackedLayout, scaling: float) -> torch.Tensor:
    """``[1, T, H, D]`` attention of the packed layout by one fused kernel per layer
    (:mod:`hybrid_rl.workers.attention_backend` chose it)."""
    if kernel in ("flash_attention_2", "varlen_attn") and query.dtype not in (torch.float16, torch.bfloat16):
        kernel = "flex_attention"  # the flash kernels compute in half precision only (fp32 on CUDA: V100, T4, ...)
    if kernel == "flex_attention":
        from hybrid_rl.workers.flex_attention import flex_packed_attention

        return flex_packed_attention(query, key, value, layout.flex(query.device), scaling)
    assert layout.cu_seq_lens is not None, f"{kernel} computes row-packed layouts only"
    fn = (attention_backend.flash_varlen_attention if kernel == "flash_attention_2"
          else attention_backend.torch_varlen_attention)
    return fn(query, key, value, layout.cu_seq_lens, layout.max_length, scaling)


def cu_seq_lens(attention_mask: torch.Tensor) -> torch.Tensor:
    """Cumulative valid-token counts ``[B + 1]`` of the rows of ``attention_mask [B, L]``."""
    lengths = attention_mask.sum(-1)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def use_varlen_attention(module: nn.Module, attn_implementation: Optional[str] = None,
                         device: Optional[torch.device] = None,
                         key: str = "actor_rollout_ref.model.attn_implementation") -> bool:
    """Switch an HF model from ``sdpa`` to the varlen attention (other implementations are kept).

    ``attn_implementation`` (``*.model.attn_implementation``; None = keep this process's current
    choice) picks the packed kernels for ``device`` (where the forward computes; default: where
    ``module``'s parameters are) (:func:`~hybrid_rl.workers.attention_backend.resolve_attention`). Returns whether the model
    now uses the varlen attention.
    """
    if not switchable_from_sdpa(module, VARLEN_ATTENTION):
        return False
    if attn_implementation is not None:
        device = torch.device(device) if device is not None else next(module.parameters()).device
        attention_backend.set_attention(attention_backend.resolve_attention(attn_implementation, device.type, key))
    module.set_attn_implementation(VARLEN_ATTENTION)
    return module.config._attn_implementation == VARLEN_ATTENTION


def switchable_from_sdpa(module: nn.Module, name: str) -> bool:
    """Whether the HF model ``module`` is on ``sdpa`` (or on ``name`` already) and may be switched to
    the registered attention ``name``. transformers refuses (with a console warning) a model whose
    attention is computed outside its attention interface (Falcon); such models keep their own."""
    config = getattr(module, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", name):
        return False
    can_set = getattr(module, "_can_set_attn_implementation", None)  # transformers' own test
    return can_set is None or can_set()


AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention_forward)
AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)
