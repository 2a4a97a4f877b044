"""Aggregate a per-token loss matrix into a scalar (``loss_agg_mode``), split-invariantly.

Modes (veRL names):

* ``token-mean``: ``sum(loss * mask) / N_tok`` — every valid token weighs the same.
* ``seq-mean-token-sum``: ``sum_i sum_t(loss * mask) / N_seq``.
* ``seq-mean-token-mean``: ``sum_i mean_t(loss | mask) / N_seq``.
* ``seq-mean-token-sum-norm``: ``sum_i sum_t(loss * mask) / (loss_scale_factor * N_seq)`` with a
  constant ``loss_scale_factor`` (default ``R = loss_mask.shape[-1]``, the max response length), as
  in Dr.GRPO, so no length bias enters through the normaliser.

``N_tok`` is the number of valid tokens and ``N_seq`` the number of rows with at least one valid
token (fully masked rows — e.g. DataProto padding rows — are excluded, as in current veRL).

Deviation from veRL: veRL's local ``seq-mean-token-sum-norm`` returns ``sum / R`` without dividing by
the number of sequences, which makes the loss scale with the batch size and depend on how the
trainer scales micro-batches; here it is a true mean over sequences like the other ``seq-mean``
modes, so one rule (below) makes every mode split-invariant.

Micro-batch / data-parallel contract (what the actor and critic rely on)
-----------------------------------------------------------------------
Let a mini-batch be split into micro-batches spread over ``dp_size`` ranks. If every call passes the
counts of the **whole mini-batch across all micro-batches and all ranks**::

    global_batch_num_tokens = sum over all ranks of loss_mask[mini_batch].sum()
    global_batch_num_seqs   = sum over all ranks of (loss_mask[mini_batch].sum(-1) > 0).sum()

(see :func:`global_batch_denominators`, then ``all_reduce(SUM)`` them across ranks), then

    sum over every (rank, micro-batch) of agg_loss(micro) == agg_loss(whole mini-batch)

for every mode, and so are the gradients. Therefore: call ``backward()`` on each micro-batch loss
as is (no ``1 / num_micro_batches`` scaling) and let gradients accumulate; the cross-rank gradient
reduction must then be a SUM. FSDP/DDP *average* gradients over ranks, so multiply each local
loss by ``dp_size`` before ``backward()`` to cancel that average. With a single rank and the full
mini-batch in one call, omit the globals and the local counts are used.
"""

from __future__ import annotations

import torch

from hybrid_rl.algorithms.masked import masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# Denominators are clamped so an all-padding micro-batch yields 0 instead of 0/0.
_MIN_DENOM = 1e-8


def global_batch_denominators(loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Local counts to all-reduce (SUM) over micro-batches and ranks before calling :func:`agg_loss`.

    Args:
        loss_mask: ``[B, R]`` mask of this rank's share of the mini-batch.

    Returns:
        ``{"global_batch_num_tokens": scalar, "global_batch_num_seqs": scalar}`` for this share.
    """
    mask = loss_mask.to(torch.float32)
    return {
        "global_batch_num_tokens": mask.sum(),
        "global_batch_num_seqs": (mask.sum(dim=-1) > 0).sum().to(torch.float32),
    }


def _denominator(given: float | int | torch.Tensor | None, local: torch.Tensor, name: str) -> torch.Tensor:
    if given is None:
        denom = local
    else:
        if not isinstance(given, torch.Tensor) and given < 0:
            raise ValueError(f"{name} must be >= 0 (a count over the whole mini-batch), got {given}")
        denom = torch.as_tensor(given, dtype=local.dtype, device=local.device)
    return denom.clamp(min=_MIN_DENOM)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_batch_num_tokens: float | int | torch.Tensor | None = None,
    global_batch_num_seqs: float | int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` into a scalar; see the module docstring for modes and the split contract.

    Args:
        loss_mat: ``[B, R]`` per-token loss.
        loss_mask: ``[B, R]`` 1 on tokens that count.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        global_batch_num_tokens: valid tokens in the whole mini-batch (all micro-batches and ranks);
            None = this call's own count. Used by ``token-mean``.
        global_batch_num_seqs: non-empty rows in the whole mini-batch; None = this call's own count.
            Used by the ``seq-mean-*`` modes.
        loss_scale_factor: constant per-sequence normaliser of ``seq-mean-token-sum-norm``;
            None = ``R``. Set it (e.g. to the configured max response length) when micro-batches
            are trimmed to different R, so all of them use the same constant.

    Returns:
        0-dim tensor.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        denom = _denominator(global_batch_num_tokens, mask.sum(), "global_batch_num_tokens")
        return masked_sum(loss_mat, mask) / denom
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {loss_agg_mode!r} (actor.loss_agg_mode / critic.loss_agg_mode); "
            f"valid modes: {list(LOSS_AGG_MODES)}"
        )
    tokens_per_seq = mask.sum(dim=-1)  # [B]
    seq_sums = masked_sum(loss_mat, mask, axis=-1)  # [B]
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / tokens_per_seq.clamp(min=_MIN_DENOM)  # empty rows: 0 / eps = 0
    else:  # seq-mean-token-sum-norm
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if scale <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {scale}")
        seq_losses = seq_sums / scale
    local_seqs = (tokens_per_seq > 0).sum().to(loss_mat.dtype)
    denom = _denominator(global_batch_num_seqs, local_seqs, "global_batch_num_seqs")
    return seq_losses.sum() / denom
