"""PPO's loss terms as objectives: the registered policy loss, the entropy bonus and the KL loss.

``ppo_objective`` composes them as veRL's actor does::

    loss = policy_loss - entropy_coeff * entropy [+ kl_loss_coef * kl_loss] [+ coef * distillation]

The entropy is always computed and reported (weight 0 when ``entropy_coeff`` is 0: no gradient); with
distillation and ``use_task_rewards=false`` the distillation term is the whole loss and the PPO terms
are reported only (weight 0). Every term's loss is its micro-batch's share of the mini-batch loss,
aggregated with the mini-batch's global denominators (``MicroBatch.agg``), so its metric is summed
over micro-batches and ranks by the learner (``summed``). Metric names are veRL's (``actor/pg_loss``,
``actor/entropy``, ``actor/kl_loss``, ...).

The configs are built from the actor section's veRL keys (``ppo_objective``); this module reads them
by attribute and never imports the workers (the objectives floor is below them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from hybrid_rl.algorithms import agg_loss, behaviour_weight_stats, get_policy_loss_fn, kl_penalty
from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig, bypass_policy_loss
from hybrid_rl.objectives.base import ForwardNeeds, MicroBatch, Objective, WeightedSum
from hybrid_rl.objectives.distillation import DistillationTerm, DistillationTermConfig
from hybrid_rl.objectives.registry import register_objective

__all__ = ["EntropyBonus", "KLLoss", "KLLossConfig", "PolicyLoss", "PolicyLossTermConfig", "ppo_objective"]

Metrics = dict[str, torch.Tensor]


@dataclass(kw_only=True)
class PolicyLossTermConfig:
    """The policy-gradient term (veRL's ``actor.policy_loss.*`` and the actor's clip keys)."""

    loss_mode: str = "vanilla"
    """``actor.policy_loss.loss_mode``: the name in hybrid_rl.algorithms' policy-loss registry."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Keyword settings every registered loss receives (``ActorConfig.loss_settings()``: clip ratios,
    ``clip_ratio_c``, ``tau_pos``/``tau_neg`` and ``actor.policy_loss.*``); each loss reads its own."""

    @classmethod
    def from_actor(cls, actor: Any) -> "PolicyLossTermConfig":
        """From the actor section (an ``ActorConfig``)."""
        return cls(loss_mode=actor.policy_loss.loss_mode, settings=actor.loss_settings())


@register_objective("policy_loss")
class PolicyLoss(Objective):
    """The registered policy-gradient loss (PPO-clip by default) against the proximal log-probs."""

    Config = PolicyLossTermConfig
    reads = ("response_mask", "advantages")
    # old_log_probs: optional only on-policy (required_keys), where absent means "the current ones"
    optional_reads = ("old_log_probs", "rollout_log_probs", "rollout_is_weights")

    def __init__(self, config: Optional[PolicyLossTermConfig] = None):
        super().__init__(config)
        self.loss_fn = get_policy_loss_fn(self.config.loss_mode)
        self._bypass: Optional[RolloutCorrectionConfig] = None  # bypass mode's correction, per update

    @property
    def summed(self) -> tuple[str, ...]:
        return ("actor/pg_loss",)

    def bind(self, context: dict[str, Any]) -> None:
        """Bypass mode: ``context["rollout_correction"]`` (the trainer's meta_info) corrects the loss."""
        correction = context.get("rollout_correction")
        self._bypass = RolloutCorrectionConfig(**correction) if correction is not None else None

    def required_keys(self, on_policy: bool = False) -> list[str]:
        keys = list(self.reads) + ([] if on_policy else ["old_log_probs"])
        return keys + (["rollout_log_probs"] if self._bypass is not None else [])

    def check_keys(self, present, on_policy: bool = False, *, caller: str = "update") -> None:
        present = list(present)
        if self._bypass is not None and "rollout_log_probs" not in present:
            raise ValueError("algorithm.rollout_correction.bypass_mode=true needs the rollout's log-probs: set "
                             "actor_rollout_ref.rollout.calculate_log_probs=true.")
        super().check_keys(present, on_policy, caller=caller)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, Metrics]:
        (pg_loss, clipfrac, ppo_kl, clipfrac_lower), corr = self._loss(mb)
        stats = {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": clipfrac_lower}
        # None: a loss that clips nothing (bypass reinforce) does not report it
        metrics = {"actor/pg_loss": pg_loss.detach(), **{k: v.detach() for k, v in stats.items() if v is not None}}
        metrics.update(corr)
        if "rollout_log_probs" in mb.batch:  # how far the sampling engine's policy is from the proximal one
            weights = behaviour_weight_stats(mb.old_log_prob, mb.batch["rollout_log_probs"], mb.mask,
                                             self.config.settings.get("behav_imp_weight_cap"))
            metrics.update({f"actor/{k}": v for k, v in weights.items()})
        return pg_loss, metrics

    def _loss(self, mb: MicroBatch) -> tuple[tuple[torch.Tensor, ...], Metrics]:
        """``((pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), rollout-correction metrics)``; in bypass
        mode the weights and rejections are recomputed against the current policy."""
        settings, batch = self.config.settings, mb.batch
        if self._bypass is not None:  # ppo_clip runs the configured loss, with all its settings
            *out, corr = bypass_policy_loss(self.loss_fn, mb.log_prob, batch["rollout_log_probs"],
                                            batch["advantages"], mb.mask, self._bypass, **settings, **mb.agg)
            return tuple(out), corr
        return self.loss_fn(mb.old_log_prob, mb.log_prob, batch["advantages"], mb.mask, **settings,
                            rollout_log_probs=batch.get("rollout_log_probs"),
                            rollout_is_weights=batch.get("rollout_is_weights"), **mb.agg), {}


@register_objective("entropy")
class EntropyBonus(Objective):
    """The mean entropy of the policy on the response tokens (a bonus: PPO weighs it -entropy_coeff)."""

    @property
    def forward(self) -> ForwardNeeds:
        return ForwardNeeds(entropy=True, entropy_grad=True)

    @property
    def summed(self) -> tuple[str, ...]:
        return ("actor/entropy",)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, Metrics]:
        term = agg_loss(mb.entropy, mb.mask, **mb.agg)
        return term, {"actor/entropy": term.detach()}


@dataclass(kw_only=True)
class KLLossConfig:
    """The KL-to-reference loss (veRL's ``actor.kl_loss_*``)."""

    kl_loss_type: str = "low_var_kl"
    """``actor.kl_loss_type``: the estimator, kl (k1) | abs | mse (k2) | low_var_kl (k3)."""
    kl_loss_coef: float = 0.001
    """``actor.kl_loss_coef``: its weight in PPO's sum (reported as ``actor/kl_coef``)."""

    @classmethod
    def from_actor(cls, actor: Any) -> "KLLossConfig":
        """From the actor section (an ``ActorConfig``)."""
        return cls(kl_loss_type=actor.kl_loss_type, kl_loss_coef=actor.kl_loss_coef)


@register_objective("kl_loss", needs_reference=True)
class KLLoss(Objective):
    """KL(policy || reference) per response token, aggregated as the policy loss (GRPO's KL loss)."""

    Config = KLLossConfig
    reads = ("response_mask", "ref_log_prob")

    @property
    def summed(self) -> tuple[str, ...]:
        return ("actor/kl_loss",)

    def step_metrics(self) -> dict[str, float]:
        return {"actor/kl_coef": self.config.kl_loss_coef}

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, Metrics]:
        kl = kl_penalty(mb.log_prob, mb.batch["ref_log_prob"], self.config.kl_loss_type)  # [b, R]
        term = agg_loss(kl, mb.mask, **mb.agg)
        return term, {"actor/kl_loss": term.detach()}


def ppo_objective(actor_cfg: Any, distillation_loss_cfg: Any = None) -> WeightedSum:
    """PPO's loss from the actor section (``ActorConfig``) and, when distillation is enabled,
    ``distillation.distillation_loss`` (a ``DistillationLossConfig``)."""
    terms: list[tuple[Objective, float]] = [(PolicyLoss(PolicyLossTermConfig.from_actor(actor_cfg)), 1.0),
                                            (EntropyBonus(), -actor_cfg.entropy_coeff)]
    if actor_cfg.use_kl_loss:
        terms.append((KLLoss(KLLossConfig.from_actor(actor_cfg)), actor_cfg.kl_loss_coef))
    if distillation_loss_cfg is not None:
        distill = DistillationTerm(DistillationTermConfig.from_settings(distillation_loss_cfg))
        if distillation_loss_cfg.use_task_rewards:
            terms.append((distill, distillation_loss_cfg.distillation_loss_coef))
        else:  # the distillation loss alone (veRL): the PPO terms are reported, not trained
            terms = [(term, 0.0) for term, _ in terms] + [(distill, 1.0)]
    return WeightedSum(terms)
