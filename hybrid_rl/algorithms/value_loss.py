"""Clipped value-function loss for the PPO critic (as in veRL / TRL).

``0.5 * agg(max((v - G)^2, (clip(v, v_old - c, v_old + c) - G)^2))``: the critic may not move its
prediction more than ``cliprange_value`` from the rollout-time value to decrease the loss.
"""

from __future__ import annotations

from typing import Any

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.algorithms.masked import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_batch_num_tokens: Any = None,
    global_batch_num_seqs: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss.

    Args:
        vpreds: ``[B, R]`` current critic predictions (with grad).
        returns: ``[B, R]`` targets from the advantage estimator.
        values: ``[B, R]`` critic values at rollout time (``batch["values"]``).
        response_mask: ``[B, R]``.
        cliprange_value: max distance of the clipped prediction from ``values``.
        loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs: see ``agg_loss`` (the same
            micro-batch/rank split contract holds).

    Returns:
        ``(vf_loss, vf_clipfrac)``: 0-dim loss and the fraction of masked tokens where the clipped
        error was the larger one (a local masked mean, for logging).
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    err_unclipped = (vpreds - returns) ** 2  # [B, R]
    err_clipped = (vpred_clipped - returns) ** 2  # [B, R]
    loss_mat = torch.maximum(err_unclipped, err_clipped)
    vf_loss = 0.5 * agg_loss(loss_mat, response_mask, loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs)
    vf_clipfrac = masked_mean(torch.gt(err_clipped, err_unclipped).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac
