"""Per-token log-probabilities and entropies from ``[..., V]`` logits without vocab-sized activations.

A naive ``log_softmax(logits).gather(labels)`` materialises (and keeps alive for backward) a second
``[batch, seq, vocab]`` tensor — for a 150k vocabulary that doubles the largest activation of the
step. Here both functions are custom autograd ops that save only the logits (already alive as the
model output) plus one or two ``[...]`` statistics, compute in float32 over blocks of rows (so the
float32 temporaries are bounded by ``chunk_rows * V``, a few MiB), and recompute the softmax block
by block in backward. Outputs are float32 (float64 for float64 logits).

``temperature`` divides the logits inside each float32 block (and the gradient in backward), so the
sampling temperature costs no vocab-sized bf16 division and no extra copy of the logits.
``logprobs_and_entropy_from_logits`` also returns the entropy, as a metric without gradient, from
the same pass (it shares the log-sum-exp), instead of a second pass over the logits.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

#: Rows per block: 2**21 / V rows keeps each float32 temporary at about 8 MiB, so the few passes
#: over a block (cast, max, exp, sum) hit the CPU's cache. Measured on 2 cores with SmolLM2's
#: vocabulary (49152), bf16 logits of 454 rows: 42-row blocks take 18 ms forward and 47 ms forward +
#: backward; 341-row (64 MiB) blocks took 71 and 111 ms.
_BLOCK_ELEMENTS = 1 << 21
#: On a GPU the same loop is bound by kernel launches, not cache: 2**21-logit blocks made ~3,000
#: blocks (x ~5 kernels, forward and again in backward) per update of 512 SmolLM2 rows of <= 256
#: tokens on an H100 (issue #39). 2**26 logits (256 MiB in float32) cut that 32-fold and stay
#: small beside the [tokens, V] logits the model has already produced.
_CUDA_BLOCK_ELEMENTS = 1 << 26


def _default_chunk_rows(vocab_size: int, device_type: str = "cpu") -> int:
    block = _CUDA_BLOCK_ELEMENTS if device_type == "cuda" else _BLOCK_ELEMENTS
    return max(1, block // max(vocab_size, 1))


def _row_blocks(x: torch.Tensor, chunk_rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(first_row, block [n, V])`` covering the rows of ``x [..., V]`` in row-major order.

    Uses views whenever the leading dims can be flattened; otherwise (e.g. ``logits[:, -R-1:-1]``
    sliced out of ``[B, L, V]``) walks dim 0 so no full contiguous copy is ever made.
    """
    vocab = x.shape[-1]
    try:
        flat = x.view(-1, vocab)
    except RuntimeError:
        inner = math.prod(x.shape[1:-1])
        for i in range(x.shape[0]):
            for start, block in _row_blocks(x[i], chunk_rows):
                yield i * inner + start, block
        return
    for start in range(0, flat.shape[0], chunk_rows):
        yield start, flat[start : start + chunk_rows]


def _out_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _scaled(block: torch.Tensor, dtype: torch.dtype, temperature: float, copy: bool = False) -> torch.Tensor:
    """``block / temperature`` in ``dtype``; a new tensor when divided or ``copy`` (else it may
    alias ``block``, which must then not be written to)."""
    if temperature == 1.0 and not copy:
        return block.to(dtype)
    out = block.to(dtype, copy=True)
    return out if temperature == 1.0 else out.div_(temperature)


def _mean_logit(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``E_p[z]`` ``[n]`` under ``p = softmax(z)`` for a block ``z [n, V]`` with log-sum-exp ``lse
    [n]`` (the entropy is ``lse - E_p[z]``), in one temporary."""
    return (z - lse[:, None]).exp_().mul_(z).sum(-1)


class _LogProbsFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _out_dtype(logits)
        flat_labels = labels.reshape(-1).long()
        lse = torch.empty(flat_labels.shape[0], dtype=dtype, device=logits.device)  # [N]
        out = torch.empty_like(lse)  # [N]
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)  # [N] or [0]
        for start, block in _row_blocks(logits, chunk_rows):
            end = start + block.shape[0]
            z = _scaled(block, dtype, temperature)
            lse[start:end] = torch.logsumexp(z, dim=-1)
            out[start:end] = z.gather(-1, flat_labels[start:end, None]).squeeze(-1) - lse[start:end]
            if with_entropy:
                entropy[start:end] = lse[start:end] - _mean_logit(z, lse[start:end])
        ctx.save_for_backward(logits, flat_labels, lse)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        entropy = entropy.view(labels.shape) if with_entropy else entropy
        ctx.mark_non_differentiable(entropy)
        return out.view(labels.shape), entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _grad_entropy: torch.Tensor):
        logits, flat_labels, lse = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat = grad.view(-1, logits.shape[-1])
        g = grad_out.reshape(-1).to(lse.dtype) / ctx.temperature  # d z / d logits = 1 / temperature
        for start, block in _row_blocks(logits, ctx.chunk_rows):
            end = start + block.shape[0]
            # d/dz_j [z_y - lse(z)] = 1[j = y] - softmax(z)_j, built in place in one temporary
            block_grad = _scaled(block, lse.dtype, ctx.temperature, copy=True).sub_(lse[start:end, None])
            block_grad.exp_().mul_(-g[start:end, None])
            block_grad.scatter_add_(-1, flat_labels[start:end, None], g[start:end, None])
            grad_flat[start:end] = block_grad
        return grad, None, None, None, None


class _EntropyFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_rows: int, temperature: float) -> torch.Tensor:
        dtype = _out_dtype(logits)
        num_rows = math.prod(logits.shape[:-1])
        lse = torch.empty(num_rows, dtype=dtype, device=logits.device)  # [N]
        mean_logit = torch.empty_like(lse)  # [N] E_p[z]
        for start, block in _row_blocks(logits, chunk_rows):
            end = start + block.shape[0]
            block = _scaled(block, dtype, temperature)
            lse[start:end] = torch.logsumexp(block, dim=-1)
            mean_logit[start:end] = _mean_logit(block, lse[start:end])
        ctx.save_for_backward(logits, lse, mean_logit)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        return (lse - mean_logit).view(logits.shape[:-1])  # H = lse - E_p[z]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, mean_logit = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat = grad.view(-1, logits.shape[-1])
        g = grad_out.reshape(-1).to(lse.dtype) / ctx.temperature  # d z / d logits = 1 / temperature
        for start, block in _row_blocks(logits, ctx.chunk_rows):
            end = start + block.shape[0]
            block = _scaled(block, lse.dtype, ctx.temperature)
            # dH/dz_j = -p_j * (z_j - E_p[z]), built in place in two temporaries
            block_grad = (block - lse[start:end, None]).exp_()
            block_grad.mul_(block - mean_logit[start:end, None]).mul_(-g[start:end, None])
            grad_flat[start:end] = block_grad
        return grad, None, None


def _chunk_rows(logits: torch.Tensor, chunk_rows: int | None) -> int:
    return chunk_rows or _default_chunk_rows(logits.shape[-1], logits.device.type)


def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without the vocab dim")


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int | None = None,
                         temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)[..., labels]`` without a vocab-sized copy kept for backward.

    Args:
        logits: ``[..., V]`` (any float dtype; any strides).
        labels: ``[...]`` integer token ids in ``[0, V)``.
        chunk_rows: rows processed per block (default: about 2**21 / V; 2**26 / V on a GPU).
        temperature: the logits are divided by it (inside the float32 blocks).

    Returns:
        ``[...]`` float32 (float64 for float64 logits) log-probabilities of ``labels``.
    """
    _check_labels(logits, labels)
    return _LogProbsFromLogits.apply(logits, labels, _chunk_rows(logits, chunk_rows), temperature, False)[0]


def logprobs_and_entropy_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int | None = None,
                                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`logprobs_from_logits` and, from the same pass over the logits, the entropy of
    ``softmax(logits / temperature)`` as a metric: ``([...] log-probs, [...] entropy without gradient)``."""
    _check_labels(logits, labels)
    return _LogProbsFromLogits.apply(logits, labels, _chunk_rows(logits, chunk_rows), temperature, True)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` along the last dim, memory-frugal like
    :func:`logprobs_from_logits`.

    Args:
        logits: ``[..., V]``.
        chunk_rows: rows processed per block (default: about 2**21 / V; 2**26 / V on a GPU).
        temperature: the logits are divided by it (inside the float32 blocks).

    Returns:
        ``[...]`` float32 (float64 for float64 logits) entropies in nats.
    """
    return _EntropyFromLogits.apply(logits, _chunk_rows(logits, chunk_rows), temperature)
