"""Supervised fine-tuning's objective: the negative log-likelihood of the target tokens.

``nll`` is the registered ``sft`` policy loss (:func:`hybrid_rl.algorithms.policy_loss.compute_policy_loss_sft`)
as an objective, without the PPO inputs it ignored (no ``old_log_probs``, no ``advantages``): the
per-token ``-log_prob`` over ``response_mask`` aggregated by ``loss_agg_mode`` with the mini-batch's
global denominators, so micro-batch and rank splits sum to the mini-batch's loss. Its metric,
``sft/loss``, is summed over micro-batches and ranks (the SFT trainer reports it as ``train/loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.objectives.base import MicroBatch, Objective
from hybrid_rl.objectives.registry import register_objective
from hybrid_rl.objectives.settings import check_loss_agg_mode

__all__ = ["NLLConfig", "NLLObjective"]


@dataclass
class NLLConfig:
    """Settings of the ``nll`` objective."""

    loss_agg_mode: str = "token-mean"
    """How token losses become the loss (veRL's ``actor.loss_agg_mode``): ``token-mean`` weighs every
    target token the same; the ``seq-mean-*`` modes weigh every sequence the same."""

    def __post_init__(self) -> None:
        check_loss_agg_mode(self.loss_agg_mode, "actor_rollout_ref.actor.objective.loss_agg_mode")


@register_objective("nll")
class NLLObjective(Objective):
    """Supervised fine-tuning: the negative log-likelihood of the target tokens (``response_mask``)."""

    Config = NLLConfig
    reads = ("response_mask",)

    @property
    def summed(self) -> tuple[str, ...]:
        return ("sft/loss",)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = agg_loss(-mb.log_prob, mb.mask, self.config.loss_agg_mode, mb.agg.get("global_batch_num_tokens"),
                        mb.agg.get("global_batch_num_seqs"))
        return loss, {"sft/loss": loss.detach()}
