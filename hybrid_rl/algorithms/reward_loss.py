"""Pairwise reward-model loss (Bradley-Terry) and its metrics, for reward-model training.

``loss = -log sigmoid(r_chosen - r_rejected - margin)`` per pair (OpenRLHF's ``PairWiseLoss`` with
its margin, TRL's ``RewardTrainer``), summed and divided by ``num_pairs``: the pairs of the whole
mini-batch, so the gradients of micro-batches with the global denominator add up to the gradient
of the mini-batch in one piece (split-invariant, as the policy losses' ``global_batch_num_seqs``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "preference_metrics"]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor] = None,
                       num_pairs: Optional[float] = None) -> torch.Tensor:
    """Mean (over ``num_pairs``, default this call's pairs) of ``-log sigmoid(chosen - rejected - margin)``.

    Args:
        chosen, rejected: ``[B]`` scalar rewards of the preferred / dispreferred responses.
        margin: ``[B]`` how much better chosen should score (None = 0).
        num_pairs: the denominator (the mini-batch's pair count when this is one micro-batch).
    """
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(f"chosen and rejected must both be [B], got {tuple(chosen.shape)} and {tuple(rejected.shape)}")
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin.to(diff.dtype)
    denominator = float(num_pairs) if num_pairs is not None else float(chosen.numel())
    if denominator <= 0:
        raise ValueError(f"num_pairs={num_pairs} must be > 0")
    return -F.logsigmoid(diff).sum() / denominator


def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """``rm/accuracy`` (chosen > rejected; ties count half), ``rm/margin`` (mean chosen - rejected),
    ``rm/chosen_mean``, ``rm/rejected_mean`` over ``[B]`` rewards."""
    chosen, rejected = chosen.detach().float(), rejected.detach().float()
    wins = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
    return {"rm/accuracy": float(wins.mean()), "rm/margin": float((chosen - rejected).mean()),
            "rm/chosen_mean": float(chosen.mean()), "rm/rejected_mean": float(rejected.mean())}
