"""Packed attention with torch's FlexAttention: one kernel launch per layer for any packed layout.

A packed ``[1, T]`` forward (:mod:`hybrid_rl.workers.packing`) is a sequence of *segments*: a
packed row (attends causally to itself), a shared prompt, or a response of a prompt group (attends
causally to itself and fully to its group's prompt, which precedes it). FlexAttention expresses
both as one ``mask_mod`` over per-token segment ids::

    attend(q, kv) = (seg[q] == seg[kv] and q >= kv) or prefix[q] == seg[kv]

with ``prefix[q]`` the segment id of the query's prompt (-2 where there is none). The block mask
is built once per forward (:class:`FlexLayout`, cached on the
:class:`~hybrid_rl.workers.varlen_attention.PackedLayout` every layer shares) and lets the kernel
skip every 128 x 128 tile that no query attends to, so the work is that of the blocks, not ``T**2``.

On CUDA the kernel is ``torch.compile``d. ``T`` varies from micro-batch to micro-batch, so queries,
keys and values are padded to a power-of-two bucket (:func:`bucket_length`): each bucket compiles
once (forward and backward), instead of once per length. Padding tokens form one more causal
segment that nothing else attends to, so no softmax row is empty and real outputs are unchanged.

On CPU the eager (uncompiled) kernel runs: it is the reference used by the CPU tests (forward only:
torch has no FlexAttention backward on CPU) and is slower there than the batched SDPA path, which
stays the CPU default (``../shared/notes/gpu.md``: 30 ms vs 6.2 ms on a 2,712-token layout).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.nn import functional as F

__all__ = ["FlexLayout", "bucket_length", "flex_layout", "flex_packed_attention", "segment_ids"]

#: The smallest padded length (one FlexAttention tile).
MIN_BUCKET = 128

_compiled: dict[str, Callable] = {}


def bucket_length(length: int) -> int:
    """The padded length of a ``length``-token layout: the next power of two >= ``MIN_BUCKET``."""
    return max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())


def segment_ids(segments: list[tuple[int, Optional[int]]], padded: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seg [padded], prefix [padded])`` long, from ``segments`` = ``(length, prefix segment
    index or None)`` in packed order. Positions past the segments (bucket padding) form one more
    segment without prefix."""
    lengths = [length for length, _ in segments]
    tail = padded - sum(lengths)
    assert tail >= 0, "the bucket holds the layout"
    counts = torch.tensor(lengths + [tail], device=device)
    ids = torch.arange(len(segments) + 1, device=device)
    prefixes = torch.tensor([-2 if p is None else p for _, p in segments] + [-2], device=device)
    return ids.repeat_interleave(counts), prefixes.repeat_interleave(counts)


@dataclass
class FlexLayout:
    """The block mask of one packed forward, shared by all its layers."""

    block_mask: Any
    """torch's ``BlockMask`` over ``[padded, padded]``."""
    length: int
    """``T``: the packed tokens."""
    padded: int
    """``T`` rounded up to its bucket (:func:`bucket_length`); equals ``T`` on CPU."""


def _mask_mod(seg: torch.Tensor, prefix: torch.Tensor) -> Callable:
    def attend(b, h, q_idx, kv_idx):
        return ((seg[q_idx] == seg[kv_idx]) & (q_idx >= kv_idx)) | (prefix[q_idx] == seg[kv_idx])

    return attend


def flex_layout(segments: list[tuple[int, Optional[int]]], device: torch.device) -> FlexLayout:
    """The :class:`FlexLayout` of ``segments`` (see :func:`segment_ids`) on ``device``."""
    from torch.nn.attention.flex_attention import create_block_mask

    from hybrid_rl.workers.fsdp_utils import to_device

    length = sum(n for n, _ in segments)
    padded = bucket_length(length) if device.type == "cuda" else length
    # built on the host and copied asynchronously: the forward never waits for the device here
    seg, prefix = (to_device(t, device) for t in segment_ids(segments, padded, torch.device("cpu")))
    kwargs = {}
    if device.type == "cuda" and "_compile" in inspect.signature(create_block_mask).parameters:
        kwargs["_compile"] = True  # never materialises the [T, T] mask
    block_mask = create_block_mask(_mask_mod(seg, prefix), None, None, padded, padded, device=device, **kwargs)
    return FlexLayout(block_mask, length, padded)


def _kernel(device: torch.device) -> Callable:
    """``flex_attention``, compiled once per process on CUDA (eager elsewhere)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _compiled:
        # one compiled graph per bucket (a handful), forward and backward
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _compiled["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["cuda"]


def flex_packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          layout: FlexLayout, scaling: float) -> torch.Tensor:
    """``query [1, H, T, D]``, ``key/value [1, H_kv, T, D]`` -> ``[1, T, H, D]`` attention over
    the packed layout (grouped-query heads as HF orders them: head ``h`` reads kv head
    ``h // (H / H_kv)``)."""
    pad = layout.padded - layout.length
    if pad:
        query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (query, key, value))  # [1, H, T_pad, D]
    with warnings.catch_warnings():  # eager (CPU) flex warns that it is unfused: expected there
        warnings.simplefilter("ignore", UserWarning)
        out = _kernel(query.device)(query, key, value, block_mask=layout.block_mask, scale=scaling,
                                    enable_gqa=query.shape[1] != key.shape[1])
    return out[:, :, :layout.length].transpose(1, 2).contiguous()  # [1, T, H, D]
