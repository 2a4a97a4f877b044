"""The advantage estimators veRL ships beside GAE, GRPO, RLOO, REINFORCE++ and ReMax, under its names.

Same uniform call path as :mod:`hybrid_rl.algorithms.advantage` (``[B, R]`` rewards and mask in,
``(advantages, returns)`` out; one score per response = its rewards summed over R; a group = the
rows sharing a prompt ``uid``):

* ``grpo_vectorized``: GRPO (already vectorised here; veRL keeps both names).
* ``rloo_vectorized``: RLOO's leave-one-out baseline; unlike ``rloo`` a singleton group gets 0 (veRL).
* ``grpo_passk``: Pass@k training (Chen et al. 2025): only the best response of a group gets an
  advantage, ``max - second max`` (divided by the group std + eps unless Dr.GRPO); the rest get 0.
* ``opo``: On-Policy RL with the optimal baseline (Hao et al. 2025): the length-weighted group mean.
* ``gpg``: GPG (Chu et al. 2025): ``alpha * (s - group mean)`` with ``alpha = B / #nonzero scores``.
* ``gdpo``: several reward components, each normalised GRPO-style within its group, summed with
  weights (``algorithm.gdpo_reward_keys`` / ``gdpo_reward_weights``: columns the scorer returns in
  its dict), then whitened over the batch's tokens.

veRL's ``optimal_token_baseline`` and ``tir_optimal_token_baseline`` are not here: they need the sum
of squared token probabilities from the old-log-prob pass, which the fused LM head does not compute
(:data:`UNSUPPORTED_ADV_ESTIMATORS` gives the one-line refusal and the nearest estimator).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybrid_rl.algorithms.advantage import (_require, compute_grpo_outcome_advantage, group_ids, group_mean_std,
                                            register_adv_est)
from hybrid_rl.algorithms.masked import masked_whiten

__all__ = ["UNSUPPORTED_ADV_ESTIMATORS", "compute_gdpo_advantage", "compute_gpg_advantage",
           "compute_grpo_passk_advantage", "compute_opo_advantage", "compute_rloo_vectorized_advantage"]

UNSUPPORTED_ADV_ESTIMATORS: dict[str, tuple[str, str]] = {
    name: ("grpo", "it weights its baseline by 1 - 2 pi + sum_v pi(v)^2 per token, and the old-log-prob pass "
                   "computes no sum of squared probabilities (the fused LM head never holds the full distribution)")
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline")
}
"""veRL estimators hybrid_rl does not run: ``name -> (nearest registered estimator, why not)``."""


def _grouped_scores(token_level_rewards: torch.Tensor, index: Any, name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scores [B], dense group ids [B], G)``: each response's summed reward and its prompt group."""
    _require(index, "index", name, "pass the prompt group ids (non_tensor_batch['uid']) as index")
    scores = token_level_rewards.sum(dim=-1)  # [B]
    return (scores, *group_ids(index, scores.device))


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    adv = per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)  # [B, R]
    return adv, adv


register_adv_est("grpo_vectorized", needs_groups=True, description=(
    "GRPO under veRL's vectorised name (GRPO is vectorised here already): veRL's numbers with the default "
    "norm_adv_by_std_in_grpo=true; with norm_adv_by_std_in_grpo=false it gives s - group mean, where veRL's "
    "trainer still divides by the group std (docs/algorithms.md, Departures)."))(
    compute_grpo_outcome_advantage)


@register_adv_est("rloo_vectorized", needs_groups=True)
@torch.no_grad()
def compute_rloo_vectorized_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO's leave-one-out baseline, veRL's vectorised form: a singleton group's advantage is 0."""
    scores, ids, num_groups = _grouped_scores(token_level_rewards, index, "rloo_vectorized")
    mean, _, count = group_mean_std(scores, ids, num_groups)
    adv = (scores - mean) * count / (count - 1).clamp(min=1) * (count > 1).to(scores.dtype)
    return _broadcast(adv, response_mask)


@register_adv_est("grpo_passk", needs_groups=True)
@torch.no_grad()
def compute_grpo_passk_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                                 epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                 **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k: the best response of each group gets ``max - second max`` (/ std), the others 0."""
    scores, ids, num_groups = _grouped_scores(token_level_rewards, index, "grpo_passk")
    adv = torch.zeros_like(scores)
    for group in range(num_groups):
        rows = torch.nonzero(ids == group).squeeze(-1)
        if rows.numel() < 2:
            raise ValueError(f"algorithm.adv_estimator=grpo_passk needs at least 2 responses per prompt, a group "
                             f"has {rows.numel()}; set actor_rollout_ref.rollout.n >= 2.")
        values = scores[rows]
        top = torch.topk(values, 2)
        gap = top.values[0] - top.values[1]
        if norm_adv_by_std_in_grpo:
            gap = gap / (torch.std(values) + epsilon)
        adv[rows[top.indices[0]]] = gap
    return _broadcast(adv, response_mask)


@register_adv_est("opo", needs_groups=True)
@torch.no_grad()
def compute_opo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                          **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: score minus the length-weighted mean score of its group (singletons: baseline 0)."""
    scores, ids, num_groups = _grouped_scores(token_level_rewards, index, "opo")
    lengths = response_mask.to(scores.dtype).sum(dim=-1)  # [B]
    weighted = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, lengths * scores)
    total = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, lengths)
    count = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, torch.ones_like(scores))
    baseline = torch.where(count > 1, weighted / total, torch.zeros_like(total))[ids]
    return _broadcast(scores - baseline, response_mask)


@register_adv_est("gpg", needs_groups=True)
@torch.no_grad()
def compute_gpg_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                          **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``B / #nonzero scores * (s - group mean)``, the advantage for the ``gpg`` policy loss."""
    scores, ids, num_groups = _grouped_scores(token_level_rewards, index, "gpg")
    mean, _, count = group_mean_std(scores, ids, num_groups)
    alpha = len(scores) / max(int(torch.count_nonzero(scores)), 1)
    return _broadcast(alpha * (scores - torch.where(count > 1, mean, torch.zeros_like(mean))), response_mask)


@register_adv_est("gdpo", needs_groups=True, requires=("algorithm.gdpo_reward_keys",))
@torch.no_grad()
def compute_gdpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                           reward_components: Optional[dict[str, torch.Tensor]] = None,
                           reward_weights: Optional[list[float]] = None, epsilon: float = 1e-6,
                           norm_adv_by_std_in_grpo: bool = True, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: each reward component GRPO-normalised in its group, weighted, summed, whitened.

    Args:
        reward_components: ``name -> [B]`` one score per response and component (the scorer's dict
            entries named by ``algorithm.gdpo_reward_keys``); None = the summed rewards alone.
        reward_weights: one weight per component (None = 1 each).
    """
    _require(index, "index", "gdpo", "pass the prompt group ids (non_tensor_batch['uid']) as index")
    components = reward_components or {"reward": token_level_rewards.sum(dim=-1)}
    weights = list(reward_weights) if reward_weights else [1.0] * len(components)
    if len(weights) != len(components):
        raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} reward "
                         f"components ({list(components)}); give one per key of algorithm.gdpo_reward_keys.")
    total = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    for weight, scores in zip(weights, components.values()):
        per_token = torch.zeros_like(total)
        per_token[:, 0] = scores.to(torch.float32)  # GRPO reads the row's sum: the position does not matter
        adv, _ = compute_grpo_outcome_advantage(per_token, response_mask, index, epsilon=epsilon,
                                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        total = total + weight * adv
    mask = response_mask.to(total.dtype)
    adv = masked_whiten(total, mask) * mask
    return adv, adv
