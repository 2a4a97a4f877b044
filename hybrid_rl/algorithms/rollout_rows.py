"""Advantages when one rollout gives several training rows (``agent.rows: every_call``, issue 57 item 2).

A black-box agent's rollout may yield k rows (a sub-agent's conversation, a compacted context). The
outcome estimator (GRPO, RLOO, ...) assumes one sample per rollout, so it runs on one representative
row per rollout: a prompt group's baseline is over its n rollouts, never over rows, and a rollout with
many rows does not pull it. The rollout's scalar advantage is then broadcast to its k rows scaled by
``1/k`` (the session-equal weight of veRL's multi-output agent loop, PR 7580): under ``token-mean`` a
rollout weighs as the mean length of its rows, comparable with a one-row rollout, instead of the sum of
all its calls. With one row per rollout this is the estimator itself, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybrid_rl.algorithms.advantage import compute_advantage, group_ids

__all__ = ["broadcast_rollout_advantage"]


def _representatives(rollout_ids: torch.Tensor, num_rollouts: int, mask: torch.Tensor) -> torch.Tensor:
    """[num_rollouts] the row of each rollout with the most sampled tokens (the first on a tie)."""
    tokens = mask.sum(-1)  # [B]
    reps = torch.full((num_rollouts,), -1, dtype=torch.long)
    for row in range(len(rollout_ids)):
        r = int(rollout_ids[row])
        if reps[r] < 0 or tokens[row] > tokens[reps[r]]:
            reps[r] = row
    return reps


def _rows(value: Any, reps: torch.Tensor, num_rows: int) -> Any:
    """An estimator input at the representative rows: per-row tensors (``[B, ...]``) and dicts of them
    (``reward_components``) are indexed, anything else (``epsilon``, ``gamma``, None) passes as is."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == num_rows:
        return value[reps]
    if isinstance(value, dict):
        return {key: _rows(v, reps, num_rows) for key, v in value.items()}
    return value


@torch.no_grad()
def broadcast_rollout_advantage(adv_estimator: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                index: Any, rollout: Any, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantage of rows grouped in rollouts (module docstring).

    Args:
        adv_estimator: a registered outcome estimator (one advantage per row, constant over its tokens).
        token_level_rewards: ``[B, R]``; every row of a rollout carries the rollout's score.
        response_mask: ``[B, R]``.
        index: length-B prompt group ids (``uid``).
        rollout: length-B rollout ids (rows of one rollout share it).
        **inputs: the estimator's other uniform inputs (``epsilon``, ``norm_adv_by_std_in_grpo``,
            ``reward_components``, ...); per-row tensors among them are taken at the representative rows.

    Returns:
        ``(advantages, returns)``, identical ``[B, R]`` tensors, zero outside the mask.
    """
    rollout_ids, num_rollouts = group_ids(rollout)
    reps = _representatives(rollout_ids, num_rollouts, response_mask)
    k = torch.zeros(num_rollouts, dtype=token_level_rewards.dtype).index_add_(
        0, rollout_ids, torch.ones(len(rollout_ids), dtype=token_level_rewards.dtype))  # [num_rollouts]
    rep_index = np.asarray(index, dtype=object)[reps.numpy()]
    rep_inputs = {key: _rows(value, reps, len(rollout_ids)) for key, value in inputs.items()}
    adv, _ = compute_advantage(adv_estimator, token_level_rewards=token_level_rewards[reps],
                               response_mask=response_mask[reps], index=rep_index, **rep_inputs)  # [num_rollouts, R]
    mask = response_mask[reps].to(adv.dtype)
    scalar = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [num_rollouts]
    if ((adv - scalar.unsqueeze(-1)) * mask).abs().max() > 1e-5 * (1 + scalar.abs().max()):
        raise ValueError(f"algorithm.adv_estimator={adv_estimator} gives a row advantages that vary along its "
                         "tokens, so a rollout's advantage cannot be shared by its rows "
                         "(actor_rollout_ref.rollout.agent.rows=every_call). Fix: use an outcome estimator such "
                         "as grpo or rloo, or agent.rows=chain.")
    per_row = (scalar / k)[rollout_ids]  # [B]
    out = per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)  # [B, R]
    return out, out
