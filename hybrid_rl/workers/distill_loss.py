"""The actor's distillation term (``distillation.enabled``): the student's loss on a micro-batch.

Per response token the registered loss of the student's log-prob against the teacher's
(:func:`~hybrid_rl.algorithms.distillation.distillation_token_loss`), trained directly or as a reward
(:func:`~hybrid_rl.algorithms.distillation.distillation_objective`). With ``use_task_rewards`` it is
added to the policy loss with ``distillation_loss_coef``; without, it replaces the whole loss (the
policy, entropy and reference-KL terms drop out, as in veRL). Only ``response_mask`` tokens count, so
multi-turn observation tokens get no distillation loss.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybrid_rl.algorithms.distillation import distillation_loss_info, distillation_objective, distillation_token_loss
from hybrid_rl.algorithms.kl import kl_penalty
from hybrid_rl.workers.distillation_config import DistillationLossConfig

__all__ = ["add_distillation"]


def add_distillation(loss: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                     batch: dict[str, torch.Tensor], agg: dict[str, Any], cfg: DistillationLossConfig,
                     student_topk: Optional[torch.Tensor] = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(the micro-batch's loss with the distillation term, that term detached, its metrics)``.

    Args:
        loss: the policy (+ entropy, KL) loss of the micro-batch.
        log_prob: ``[B, R]`` the student's log-probs of the sampled tokens (with grad).
        old_log_prob: ``[B, R]`` the behaviour policy's (the ratio of ``use_policy_gradient``).
        batch: the micro-batch on the device (``teacher_log_prob``, ``response_mask``).
        agg: ``loss_agg_mode`` and the global denominators, as the policy loss gets them.
        student_topk: ``[B, R, K]`` the student's log-probs at the teacher's top-K ids (a top-K
            loss; ``batch`` then holds ``teacher_topk_log_probs``).
    """
    mask = batch["response_mask"]
    teacher = batch["teacher_log_prob"]
    topk = distillation_loss_info(cfg.loss_mode).use_topk
    student_in, teacher_in = (student_topk, batch["teacher_topk_log_probs"]) if topk else (log_prob, teacher)
    losses = distillation_token_loss(cfg.loss_mode, student_in, teacher_in, loss_max_clamp=cfg.loss_max_clamp,
                                     log_prob_min_clamp=cfg.log_prob_min_clamp)
    low, high = cfg.clip_bounds()
    term, stats = distillation_objective(losses, log_prob, old_log_prob, mask, use_policy_gradient=cfg.use_policy_gradient,
                                         clip_ratio_low=low, clip_ratio_high=high, **agg)
    total = loss + cfg.distillation_loss_coef * term if cfg.use_task_rewards else term
    picked = mask.bool()
    detached = losses.detach()[picked]
    teacher_kl = kl_penalty(log_prob.detach(), teacher, "k3")[picked]  # KL(student || teacher) per token
    count = picked.sum().clamp(min=1)
    stats = {**stats,
             "actor/distillation/abs_loss": detached.abs().sum() / count,
             "actor/distillation/loss_max": detached.max() if detached.numel() else detached.new_zeros(()),
             "actor/distillation/loss_min": detached.min() if detached.numel() else detached.new_zeros(()),
             "actor/distillation/teacher_kl": teacher_kl.sum() / count,
             "actor/distillation/teacher_log_prob": teacher[picked].sum() / count}
    if topk:  # how much of each distribution the K tokens hold (veRL's student_mass / teacher_mass)
        stats["actor/distillation/student_mass"] = student_in.detach().exp().sum(-1)[picked].sum() / count
        stats["actor/distillation/teacher_mass"] = teacher_in.exp().sum(-1)[picked].sum() / count
    stats = {k if k.startswith("actor/") else f"actor/{k}": v for k, v in stats.items()}
    return total, term.detach(), stats
