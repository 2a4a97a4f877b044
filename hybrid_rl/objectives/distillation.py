"""On-policy distillation's term (``distillation.enabled``): the student's loss against the teacher.

Per response token the registered loss of the student's log-prob against the teacher's
(:func:`~hybrid_rl.algorithms.distillation.distillation_token_loss`), trained directly or as a reward
(:func:`~hybrid_rl.algorithms.distillation.distillation_objective`). PPO's objective
(:func:`hybrid_rl.objectives.ppo.ppo_objective`) adds it with ``distillation_loss_coef`` when
``use_task_rewards``; without, it is the whole loss (the policy, entropy and reference-KL terms drop
out, as in veRL). Only ``response_mask`` tokens count, so multi-turn observation tokens get no
distillation loss. A top-K loss (``forward_kl_topk``) asks the learner's forward for the student's
log-probs at the teacher's top-K ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybrid_rl.algorithms.distillation import distillation_loss_info, distillation_objective, distillation_token_loss
from hybrid_rl.algorithms.kl import kl_penalty
from hybrid_rl.objectives.base import ForwardNeeds, MicroBatch, Objective
from hybrid_rl.objectives.registry import register_objective

__all__ = ["DistillationTerm", "DistillationTermConfig"]

TOPK_IDS_KEY = "teacher_topk_ids"
"""Batch key of the teacher's top-K token ids ``[B, R, K]``."""


@dataclass(kw_only=True)
class DistillationTermConfig:
    """How the teacher's scores train the student (veRL's ``distillation.distillation_loss``; the
    weight, ``distillation_loss_coef``, and ``use_task_rewards`` are the composition's)."""

    loss_mode: str = "k3"
    """The registered per-token loss (hybrid_rl.algorithms.distillation), e.g. k3 or forward_kl_topk."""
    loss_max_clamp: Optional[float] = None
    """Clamp each token's loss to [-loss_max_clamp, loss_max_clamp]; None: no clamp."""
    log_prob_min_clamp: Optional[float] = None
    """``forward_kl_topk``: clamp both top-K log-probs from below first; None: no clamp."""
    use_policy_gradient: bool = False
    """The negated per-token loss is a reward for the clipped policy loss; false: backpropagated directly."""
    clip_ratio_low: float = 0.2
    """``use_policy_gradient``: lower clip, ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """``use_policy_gradient``: upper clip, ratio <= 1 + clip_ratio_high."""

    @classmethod
    def from_settings(cls, loss_cfg: Any) -> "DistillationTermConfig":
        """From ``distillation.distillation_loss`` (a ``DistillationLossConfig``)."""
        low, high = loss_cfg.clip_bounds()
        return cls(loss_mode=loss_cfg.loss_mode, loss_max_clamp=loss_cfg.loss_max_clamp,
                   log_prob_min_clamp=loss_cfg.log_prob_min_clamp, use_policy_gradient=loss_cfg.use_policy_gradient,
                   clip_ratio_low=low, clip_ratio_high=high)

    @property
    def use_topk(self) -> bool:
        """Whether the loss compares top-K distributions (reads the teacher's top-K keys)."""
        return distillation_loss_info(self.loss_mode).use_topk


@register_objective("distillation")
class DistillationTerm(Objective):
    """The student's distillation loss against the teacher's log-probs (``teacher_log_prob``)."""

    Config = DistillationTermConfig
    reads = ("response_mask", "teacher_log_prob")

    @property
    def forward(self) -> ForwardNeeds:
        return ForwardNeeds(topk_ids_key=TOPK_IDS_KEY if self.config.use_topk else None)

    @property
    def summed(self) -> tuple[str, ...]:
        return ("actor/distillation/loss",)

    def required_keys(self, on_policy: bool = False) -> list[str]:
        return list(self.reads) + ([TOPK_IDS_KEY, "teacher_topk_log_probs"] if self.config.use_topk else [])

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, batch, mask = self.config, mb.batch, mb.mask
        teacher = batch["teacher_log_prob"]
        topk = cfg.use_topk
        student_in, teacher_in = (mb.topk_log_prob, batch["teacher_topk_log_probs"]) if topk else (mb.log_prob, teacher)
        losses = distillation_token_loss(cfg.loss_mode, student_in, teacher_in, loss_max_clamp=cfg.loss_max_clamp,
                                         log_prob_min_clamp=cfg.log_prob_min_clamp)  # [b, R]
        term, stats = distillation_objective(losses, mb.log_prob, mb.old_log_prob, mask,
                                             use_policy_gradient=cfg.use_policy_gradient,
                                             clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                                             **mb.agg)
        picked = mask.bool()
        detached = losses.detach()[picked]
        teacher_kl = kl_penalty(mb.log_prob.detach(), teacher, "k3")[picked]  # KL(student || teacher) per token
        count = picked.sum().clamp(min=1)
        stats = {**stats,
                 "actor/distillation/loss": term.detach(),
                 "actor/distillation/abs_loss": detached.abs().sum() / count,
                 "actor/distillation/loss_max": detached.max() if detached.numel() else detached.new_zeros(()),
                 "actor/distillation/loss_min": detached.min() if detached.numel() else detached.new_zeros(()),
                 "actor/distillation/teacher_kl": teacher_kl.sum() / count,
                 "actor/distillation/teacher_log_prob": teacher[picked].sum() / count}
        if topk:  # how much of each distribution the K tokens hold (veRL's student_mass / teacher_mass)
            stats["actor/distillation/student_mass"] = student_in.detach().exp().sum(-1)[picked].sum() / count
            stats["actor/distillation/teacher_mass"] = teacher_in.exp().sum(-1)[picked].sum() / count
        return term, {k if k.startswith("actor/") else f"actor/{k}": v for k, v in stats.items()}
