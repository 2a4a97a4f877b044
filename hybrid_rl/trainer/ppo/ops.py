"""Driver-side batch operations of one PPO step (light math on DataProto, no model calls).

``apply_kl_penalty`` and ``compute_advantage`` wrap the pure functions of :mod:`hybrid_rl.algorithms`,
reading and writing the batch keys of :mod:`hybrid_rl.schema`. (The plumbing of a generate call,
shared with held-out validation, is :mod:`hybrid_rl.trainer.core.generation`'s.)
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
import torch

from hybrid_rl import algorithms
from hybrid_rl.algorithms.rollout_rows import broadcast_rollout_advantage
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.ppo import agent_rows


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty: str) -> tuple[DataProto, dict[str, float]]:
    """``token_level_rewards = token_level_scores - beta * KL(actor || ref)`` per token.

    KL is estimated on the sampled tokens from ``old_log_probs`` and ``ref_log_prob`` (both
    [B, R]); the controller sees the batch-mean per-sequence KL and updates ``beta``.
    """
    response_mask = data.batch["response_mask"].float()  # [B, R]
    kld = algorithms.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty)
    kld = kld * response_mask  # [B, R]
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = float(algorithms.masked_mean(kld, response_mask, axis=-1).mean())  # mean of per-seq KL
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


SCORER_COLUMN = "reward_extra_{}"
"""The non-tensor column ``compute_reward`` keeps for each key of a scorer's dict result."""


def scorer_keys(data: DataProto) -> list[str]:
    """The keys the scorer returned in its dict for this batch (its ``reward_extra_*`` columns)."""
    prefix = SCORER_COLUMN.format("")
    return sorted(k[len(prefix):] for k in data.non_tensor_batch if k.startswith(prefix))


def scorer_column(data: DataProto, key: str) -> Optional[torch.Tensor]:
    """``[B]`` float64 of the scorer's ``key`` per row (a failed row, None, counts as 0 like its score);
    None when the scorer returned no such key."""
    column = data.non_tensor_batch.get(SCORER_COLUMN.format(key))
    if column is None:
        return None
    return torch.as_tensor([0.0 if v is None else float(v) for v in column], dtype=torch.float64)


def reward_components(data: DataProto, keys: Optional[list[str]]) -> Optional[dict[str, torch.Tensor]]:
    """``key -> [B]`` float scores of the reward components the scorer returned in its dict; None
    without keys. ValueError naming the missing key."""
    if not keys:
        return None
    out = {}
    for key in keys:
        values = scorer_column(data, key)
        if values is None:
            raise ValueError(f"algorithm.gdpo_reward_keys names {key!r}, which the scorer does not return (its dict "
                             f"keys: {scorer_keys(data)}); return it from compute_score as a dict entry or fix the key.")
        out[key] = values.to(torch.float32)
    return out


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    components: Optional[dict[str, torch.Tensor]] = None,
    component_weights: Optional[list[float]] = None,
    inputs: Iterable[str] = (),
) -> DataProto:
    """Fill ``advantages`` and ``returns`` ([B, R]) with the registered estimator ``adv_estimator``
    (``components`` / ``component_weights``: the reward components of estimators that read them).
    ``inputs``: the optional estimator inputs the step plan provides, as ``compute_advantage``'s
    contract reads them (``values`` when the plan has a critic, ``reward_baselines`` when it has a
    greedy baseline; hybrid_rl/trainer/ppo/contracts.py)."""
    tensors = data.batch
    planned = set(inputs)
    estimate = algorithms.compute_advantage
    grouping: dict[str, Any] = {"index": data.non_tensor_batch.get("uid")}
    if agent_rows.has_rollout_rows(data):  # several rows per rollout: one advantage per rollout, shared
        estimate = broadcast_rollout_advantage
        grouping = agent_rows.rollout_advantage_inputs(data)
    advantages, returns = estimate(
        adv_estimator,
        token_level_rewards=tensors["token_level_rewards"],
        response_mask=tensors["response_mask"],
        values=tensors["values"] if "values" in planned else None,
        reward_baselines=tensors["reward_baselines"] if "reward_baselines" in planned else None,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        reward_components=components,
        reward_weights=component_weights,
        **grouping,
    )
    data.batch["advantages"] = advantages.to(torch.float32)
    data.batch["returns"] = returns.to(torch.float32)
    return data


def apply_rollout_correction(data: DataProto, cfg: Any) -> dict[str, float]:
    """The rollout correction of one batch (``algorithm.rollout_correction``): ``rollout_is_weights``
    [B, R] when importance weights are asked for, ``response_mask`` [B, R] without the rejected tokens
    (advantages, the critic and the update then see the reduced mask, as in veRL); returns the
    ``rollout_corr/*`` metrics. Needs ``old_log_probs`` and ``rollout_log_probs``."""
    from hybrid_rl.algorithms.rollout_correction import compute_rollout_correction

    tensors = data.batch
    weights, mask, metrics = compute_rollout_correction(tensors["old_log_probs"], tensors["rollout_log_probs"],
                                                        tensors["response_mask"], cfg)
    if weights is not None:
        tensors["rollout_is_weights"] = weights.to(torch.float32)
    tensors["response_mask"] = mask
    return metrics


def apply_overlong_penalty(data: DataProto, cfg: Any, max_response_length: int) -> dict[str, float]:
    """DAPO's soft overlong punishment (``reward_model.overlong_buffer``, :func:`~hybrid_rl.algorithms.dapo.overlong_penalty`)
    added to ``token_level_scores`` [B, R] at each response's last token; returns its metrics when
    ``cfg.log``. A response's length counts every token of its response part (tool observations too)."""
    from hybrid_rl.algorithms.dapo import overlong_penalty

    responses = data.batch["responses"]  # [B, R]
    lengths = data.batch["attention_mask"][:, -responses.shape[-1]:].sum(-1)  # [B]
    penalty = overlong_penalty(lengths, max_response_length, cfg.len, cfg.penalty_factor)
    last = (lengths - 1).clamp(min=0).long()
    scores = data.batch["token_level_scores"]
    if SCORER_COLUMN.format("score") not in data.non_tensor_batch:  # the score before the penalty (DAPO's filter)
        data.non_tensor_batch[SCORER_COLUMN.format("score")] = np.array(scores.sum(-1).tolist(), dtype=object)
    scores[torch.arange(len(scores)), last] += penalty.to(scores.dtype)
    if not cfg.log:
        return {}
    return {"reward/overlong_penalty_mean": float(penalty.mean()),
            "reward/overlong_frac": float((penalty < 0).float().mean())}
