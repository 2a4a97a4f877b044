"""Log-probs and entropies straight from the last hidden states and the LM head, never holding the logits.

:mod:`hybrid_rl.algorithms.logits` already avoids a second vocab-sized copy, but the logits ``[N, V]``
themselves stay alive for backward and backward builds their gradient ``[N, V]``: at SmolLM2's
49152-token vocabulary and 1024 response tokens a micro-batch, 96 MiB each in bf16 (192 MiB in
fp32). This op (veRL's ``use_fused_kernels``, done in torch) takes ``hidden [N, H]`` and the head's
``weight [V, H]`` instead and walks the vocabulary in blocks of :data:`VOCAB_BLOCK` columns:

- forward: ``z_b = hidden @ W_b^T`` per block, folded into a running log-sum-exp (and the running
  ``E_p[z]`` for the entropy) and the label's logit; saved for backward: ``hidden``, ``weight``,
  ``labels`` and the ``[N]`` statistics.
- backward: ``z_b`` is recomputed (one extra head matmul, the price of the memory), its gradient
  ``g_z = (1[j = y] - p_j) g_lp - p_j (z_j - E_p[z]) g_H`` (divided by the temperature) is built in
  float32 and cast to the compute dtype, then ``grad_hidden += g_z @ W_b`` (float32 accumulator)
  and, when the weight trains, ``grad_W_b = g_z^T @ hidden`` (exact per block).

The block size does not depend on the number of rows, so a row's result is the same however the
rows are split into micro-batches. Outputs are float32 (float64 for float64 inputs), as in
:mod:`~hybrid_rl.algorithms.logits`.
"""

from __future__ import annotations

from typing import Optional

import torch

VOCAB_BLOCK = 2048
"""Vocabulary columns per block: float32 temporaries of ``N x 2048`` (8 MiB at 1024 rows), and each
block's matmul still has 2048 output columns."""


def _blocks(vocab: int) -> range:
    return range(0, vocab, VOCAB_BLOCK)


def _block_logits(hidden: torch.Tensor, weight: torch.Tensor, start: int, dtype: torch.dtype,
                  temperature: float) -> torch.Tensor:
    """``(hidden @ W[start:start+VOCAB_BLOCK]^T) / temperature`` as ``[N, b]`` in ``dtype``: the matmul
    in the inputs' dtype (as the LM head computes it), the rest in ``dtype``."""
    z = (hidden @ weight[start:start + VOCAB_BLOCK].T).to(dtype)  # [N, b]
    return z if temperature == 1.0 else z.div_(temperature)


def _in_block(labels: torch.Tensor, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(column [N, 1], inside [N])``: each label's column in the block ``[start, start + width)``
    (clamped into it) and whether the label falls there."""
    local = labels - start  # [N]
    return local.clamp(0, width - 1)[:, None], (local >= 0) & (local < width)


def _label_logit(z: torch.Tensor, labels: torch.Tensor, start: int, current: torch.Tensor) -> torch.Tensor:
    """``current`` ``[N]`` with the rows whose label falls in this block set to ``z[row, label - start]``."""
    column, inside = _in_block(labels, start, z.shape[1])
    return torch.where(inside, z.gather(1, column).squeeze(1), current)


def _fold(lse: torch.Tensor, mean: Optional[torch.Tensor], z: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Fold a block ``z [N, b]`` into the running ``lse [N]`` and ``mean = E_p[z] [N]`` (None: not
    tracked)."""
    block_lse = torch.logsumexp(z, dim=-1)  # [N]
    new_lse = torch.logaddexp(lse, block_lse)
    if mean is not None:
        block_mean = (z - block_lse[:, None]).exp_().mul_(z).sum(-1)  # E_{p_b}[z] within the block
        mean = (lse - new_lse).exp() * mean + (block_lse - new_lse).exp() * block_mean
        mean = torch.nan_to_num(mean)  # the first block: exp(-inf) * 0
    return new_lse, mean


class _LinearLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                entropy_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        rows = hidden.shape[0]
        lse = torch.full((rows,), float("-inf"), dtype=dtype, device=hidden.device)  # [N]
        mean = torch.zeros_like(lse) if entropy_mode != "none" else None  # [N] E_p[z]
        label_logit = torch.zeros_like(lse)  # [N]
        for start in _blocks(weight.shape[0]):
            z = _block_logits(hidden, weight, start, dtype, temperature)  # [N, b]
            label_logit = _label_logit(z, labels, start, label_logit)
            lse, mean = _fold(lse, mean, z)
        entropy = lse - mean if mean is not None else lse.new_empty(0)
        ctx.save_for_backward(hidden, weight, labels, lse, mean if entropy_mode == "grad" else lse.new_empty(0))
        ctx.temperature, ctx.entropy_mode = temperature, entropy_mode
        if entropy_mode != "grad":
            ctx.mark_non_differentiable(entropy)
        return label_logit - lse, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp: Optional[torch.Tensor], grad_entropy: Optional[torch.Tensor]):
        hidden, weight, labels, lse, mean = ctx.saved_tensors
        temperature, dtype = ctx.temperature, lse.dtype
        g_lp = grad_lp.to(dtype) if grad_lp is not None else torch.zeros_like(lse)  # [N]
        g_ent = grad_entropy.to(dtype) if ctx.entropy_mode == "grad" and grad_entropy is not None else None
        grad_hidden = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for start in _blocks(weight.shape[0]):
            z = _block_logits(hidden, weight, start, dtype, temperature)  # [N, b]
            p = (z - lse[:, None]).exp_()  # softmax probabilities of the block
            # g_z = -p * (g_lp + g_H * (z - E_p[z])) + 1[j = y] * g_lp, in place in z's buffers
            coeff = g_lp[:, None] if g_ent is None else z.sub_(mean[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])
            g_z = p.mul_(coeff).neg_()
            column, inside = _in_block(labels, start, g_z.shape[1])
            g_z.scatter_add_(1, column, (g_lp * inside)[:, None])
            if temperature != 1.0:
                g_z.div_(temperature)
            g_z = g_z.to(hidden.dtype)
            w_block = weight[start:start + VOCAB_BLOCK]
            if grad_hidden is not None:
                grad_hidden += g_z @ w_block  # [N, H]
            if grad_weight is not None:
                grad_weight[start:start + VOCAB_BLOCK] = g_z.T @ hidden  # [b, H]
        grad_hidden = grad_hidden.to(hidden.dtype) if grad_hidden is not None else None
        return grad_hidden, grad_weight, None, None, None


def linear_logprobs_and_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                temperature: float = 1.0, entropy: Optional[str] = None
                                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``log_softmax(hidden @ weight^T / temperature)[labels]`` and optionally the entropy, without
    the ``[N, V]`` logits.

    Args:
        hidden: ``[N, H]`` last hidden states (after the final norm), the LM head's input.
        weight: ``[V, H]`` the LM head's weight (no bias), in ``hidden``'s dtype.
        labels: ``[N]`` integer token ids in ``[0, V)``.
        temperature: the logits are divided by it (in float32, after the matmul).
        entropy: None = no entropy; ``"metric"`` = the entropy without gradient; ``"grad"`` = the
            entropy with its gradient (an entropy bonus in the loss).

    Returns:
        ``(log_probs [N], entropy [N] | None)``, float32 (float64 for float64 inputs).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [N, H] and weight {tuple(weight.shape)} [V, H]")
    if tuple(labels.shape) != (hidden.shape[0],):
        raise ValueError(f"labels {tuple(labels.shape)} must be [N] with N = {hidden.shape[0]} rows of hidden")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    if entropy not in (None, "metric", "grad"):
        raise ValueError(f"entropy={entropy!r} must be None, 'metric' or 'grad'")
    log_probs, ent = _LinearLogProbs.apply(hidden, weight, labels.long(), float(temperature), entropy or "none")
    return log_probs, (ent if entropy else None)
