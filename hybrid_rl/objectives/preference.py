"""Pairwise objectives: DPO and its family on a policy's log-probs, Bradley-Terry on a scalar head.

Rows come in adjacent pairs within a micro-batch: row ``2i`` is a pair's chosen response and row
``2i + 1`` its rejected one (the learner keeps the two rows of a pair in one micro-batch, since the
registry marks these objectives ``paired``). A micro-batch's loss is its share of the mini-batch's
mean over pairs: the sum of its pair losses divided by the mini-batch's pair count
``agg["global_batch_num_seqs"] / 2`` (this micro-batch's own pairs when the learner gives no global
count), so summing the micro-batches' losses gives the mini-batch mean, and so do the gradients.

Metric names: ``dpo/`` followed by TRL's ``DPOTrainer`` names (``dpo/rewards/chosen``,
``dpo/rewards/rejected``, ``dpo/rewards/accuracies``, ``dpo/rewards/margins``, ``dpo/logps/chosen``,
``dpo/logps/rejected``) and ``dpo/loss``; Bradley-Terry reports the reward-model trainer's
``rm/loss``, ``rm/accuracy``, ``rm/margin``, ``rm/chosen_mean`` and ``rm/rejected_mean``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hybrid_rl.algorithms.preference_loss import (DPO_LOSS_TYPES, LABEL_SMOOTHING_LOSS_TYPES, LENGTH_NORMALISED,
                                                  REFERENCE_FREE_LOSS_TYPES, dpo_loss, dpo_metrics,
                                                  sequence_log_probs)
from hybrid_rl.algorithms.reward_loss import bradley_terry_loss, preference_metrics
from hybrid_rl.objectives.base import MicroBatch, Objective
from hybrid_rl.objectives.registry import register_objective

__all__ = ["BradleyTerryObjective", "DPOConfig", "DPOObjective", "check_pairs", "pair_count"]

_KEY = "actor_rollout_ref.actor.objective"


def _number(name: str, value: Any) -> float:
    """``value`` as a finite float; a one-line ValueError naming ``{_KEY}.{name}`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{_KEY}.{name} must be a finite number, got {value!r}. Fix: set it to a number.")
    return float(value)


@dataclass
class DPOConfig:
    """Settings of the ``dpo`` objective: TRL's ``DPOConfig`` / ``CPOConfig`` names and defaults."""

    beta: float = 0.1
    """Inverse temperature of the implicit reward (IPO's ``tau``, SimPO's ``beta``); > 0."""
    loss_type: str = "sigmoid"
    """TRL's ``loss_type``: ``sigmoid`` (DPO), ``robust``, ``hinge``, ``ipo`` or ``simpo`` (reference-free)."""
    label_smoothing: float = 0.0
    """Probability that a pair's label is flipped, in ``[0, 0.5)`` (cDPO / Robust DPO); sigmoid, robust, simpo."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin (``loss_type=simpo`` only); >= 0."""
    reference_free: bool = False
    """Ignore the reference policy (an implicit uniform reference): no ``ref_log_prob`` is read."""

    def __post_init__(self) -> None:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"{_KEY}.loss_type={self.loss_type!r} is not a DPO loss type; valid: "
                             f"{list(DPO_LOSS_TYPES)}. Fix: pick one of them.")
        if _number("beta", self.beta) <= 0:
            raise ValueError(f"{_KEY}.beta must be > 0, got {self.beta}. Fix: set a positive value "
                             "(TRL's default is 0.1).")
        smoothing = _number("label_smoothing", self.label_smoothing)
        if not 0 <= smoothing < 0.5:
            raise ValueError(f"{_KEY}.label_smoothing must be in [0, 0.5), got {self.label_smoothing}. "
                             "Fix: set the probability that a label is flipped, below 0.5 (0 = none).")
        if smoothing and self.loss_type not in LABEL_SMOOTHING_LOSS_TYPES:
            raise ValueError(f"{_KEY}.label_smoothing={self.label_smoothing} has no effect with "
                             f"loss_type={self.loss_type!r}. Fix: set it to 0, or use one of "
                             f"{list(LABEL_SMOOTHING_LOSS_TYPES)}.")
        if _number("simpo_gamma", self.simpo_gamma) < 0:
            raise ValueError(f"{_KEY}.simpo_gamma must be >= 0, got {self.simpo_gamma}. Fix: set SimPO's "
                             "target margin to 0 or more (TRL's default is 0.5).")
        if not isinstance(self.reference_free, bool):
            raise ValueError(f"{_KEY}.reference_free must be true or false, got {self.reference_free!r}. "
                             "Fix: set a boolean.")


def check_pairs(mb_rows: int, name: str) -> None:
    """ValueError unless a micro-batch of ``mb_rows`` rows holds whole (chosen, rejected) pairs."""
    if mb_rows % 2:
        raise ValueError(f"the {name} objective got a micro-batch of {mb_rows} rows: not whole (chosen, rejected) "
                         "pairs (rows 2i and 2i+1). Fix: keep each pair's two rows adjacent and use an even "
                         "batch and micro-batch size.")


def pair_count(agg: dict[str, Any], mb_rows: int) -> Any:
    """The mini-batch's pair count: ``global_batch_num_seqs / 2`` (every row of a pair has a response),
    or this micro-batch's ``mb_rows / 2`` when the learner gives no global count."""
    seqs = agg.get("global_batch_num_seqs")
    return mb_rows / 2 if seqs is None else seqs / 2


@register_objective("dpo", paired=True, needs_reference=True)
class DPOObjective(Objective):
    """Direct preference optimisation with TRL's loss types (sigmoid, robust, hinge, ipo, simpo).

    Reads ``response_mask`` ``[b, R]`` and, unless reference-free, ``ref_log_prob`` ``[b, R]``;
    sequence log-probs are masked sums of the per-token log-probs (masked means for ``ipo`` and
    ``simpo``, as TRL), the reference's reduced the same way.
    """

    Config = DPOConfig
    reads = ("response_mask", "ref_log_prob")

    @property
    def needs_reference(self) -> bool:
        """This configuration reads the reference's log-probs (not ``simpo``, not ``reference_free``)."""
        cfg = self.config
        return not (cfg.reference_free or cfg.loss_type in REFERENCE_FREE_LOSS_TYPES)

    @property
    def summed(self) -> tuple[str, ...]:
        return ("dpo/loss",)

    def required_keys(self, on_policy: bool = False) -> list[str]:
        return ["response_mask", "ref_log_prob"] if self.needs_reference else ["response_mask"]

    def describe(self) -> str:
        return f"dpo ({self.config.loss_type})"

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.config
        rows = mb.log_prob.shape[0]
        check_pairs(rows, self.name)
        average = cfg.loss_type in LENGTH_NORMALISED
        logps = sequence_log_probs(mb.log_prob, mb.mask, average)  # [b]
        ref_chosen = ref_rejected = None
        if self.needs_reference:
            ref = sequence_log_probs(mb.batch["ref_log_prob"], mb.mask, average)  # [b]
            ref_chosen, ref_rejected = ref[0::2], ref[1::2]
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            logps[0::2], logps[1::2], ref_chosen, ref_rejected, beta=cfg.beta, loss_type=cfg.loss_type,
            label_smoothing=cfg.label_smoothing, simpo_gamma=cfg.simpo_gamma, reference_free=cfg.reference_free)
        loss = losses.sum() / pair_count(mb.agg, rows)
        stats = dpo_metrics(chosen_rewards, rejected_rewards, logps[0::2], logps[1::2])
        metrics = {"dpo/loss": loss.detach(), **{f"dpo/{k}": v for k, v in stats.items()}}
        return loss, metrics


@register_objective("bradley_terry", paired=True)
class BradleyTerryObjective(Objective):
    """Bradley-Terry pairwise loss on a scalar head's scores: ``-logsigmoid(chosen - rejected - margin)``.

    Reads the head's ``[b]`` scores (:attr:`MicroBatch.scores`) and, when present, ``margin`` ``[b]``:
    each pair's margin on its chosen row (row ``2i``; the rejected row's value is not read).
    """

    reads = ()
    optional_reads = ("margin",)

    @property
    def summed(self) -> tuple[str, ...]:
        return ("rm/loss",)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if mb.scores is None or mb.scores.dim() != 1:
            shape = None if mb.scores is None else tuple(mb.scores.shape)
            raise ValueError(f"the bradley_terry objective needs one score per row ([b]) from a scalar head, got "
                             f"{shape}. Fix: train it with the reward-model head.")
        rows = mb.scores.shape[0]
        check_pairs(rows, self.name)
        chosen, rejected = mb.scores[0::2], mb.scores[1::2]  # [b/2] each
        margin = mb.batch.get("margin")
        margin = None if margin is None else margin[0::2].to(chosen.device)
        loss = bradley_terry_loss(chosen, rejected, margin, num_pairs=float(pair_count(mb.agg, rows)))
        metrics = {"rm/loss": loss.detach()}
        for name, value in preference_metrics(chosen, rejected).items():  # host floats, as the RM logs them
            metrics[name] = torch.tensor(value, dtype=torch.float64, device=chosen.device)
        return loss, metrics
