"""The critic's objective: veRL's clipped value loss on a value head's per-token predictions.

``0.5 * agg(max((v - R)^2, (clip(v, V - c, V + c) - R)^2))`` with ``v`` the head's values
(:attr:`~hybrid_rl.objectives.base.MicroBatch.scores` ``[b, R]``), ``V`` the rollout-time ``values``,
``R`` the ``returns`` and ``c`` = ``cliprange_value``
(:func:`~hybrid_rl.algorithms.value_loss.compute_value_loss`). Metrics: ``critic/vf_loss`` (the
micro-batches' shares, summed), ``critic/vf_clipfrac`` and ``critic/vpred_mean`` per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hybrid_rl.algorithms import compute_value_loss, masked_mean
from hybrid_rl.objectives.base import MicroBatch, Objective
from hybrid_rl.objectives.registry import register_objective
from hybrid_rl.objectives.settings import check_loss_agg_mode

__all__ = ["ValueConfig", "ValueObjective"]

_KEY = "critic"


@dataclass
class ValueConfig:
    """Settings of the ``value`` objective: veRL's ``critic.*`` names and defaults."""

    cliprange_value: float = 0.5
    """Value clipping: the prediction is clipped to ``values +- cliprange_value``; > 0."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the per-token value loss (see ``actor.loss_agg_mode``)."""

    def __post_init__(self) -> None:
        value = self.cliprange_value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{_KEY}.cliprange_value must be a finite number > 0, got {value!r}. "
                             "Fix: set e.g. 0.5.")
        check_loss_agg_mode(self.loss_agg_mode, f"{_KEY}.loss_agg_mode")


@register_objective("value")
class ValueObjective(Objective):
    """PPO's clipped value loss on a value head's per-token predictions (the critic)."""

    Config = ValueConfig
    reads = ("response_mask", "values", "returns")

    @property
    def summed(self) -> tuple[str, ...]:
        return ("critic/vf_loss",)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        vpreds = mb.scores
        if vpreds is None or vpreds.dim() != 2:
            shape = None if vpreds is None else tuple(vpreds.shape)
            raise ValueError(f"the value objective needs one value per response token ([b, R]) from a value head, "
                             f"got {shape}. Fix: train it with the value head (the critic).")
        cfg = self.config
        agg = {**mb.agg, "loss_agg_mode": cfg.loss_agg_mode}
        mask = mb.mask
        vf_loss, vf_clipfrac = compute_value_loss(vpreds, mb.batch["returns"], mb.batch["values"], mask,
                                                  cfg.cliprange_value, **agg)
        metrics = {"critic/vf_loss": vf_loss.detach(), "critic/vf_clipfrac": vf_clipfrac.detach(),
                   "critic/vpred_mean": masked_mean(vpreds.detach(), mask)}
        return vf_loss, metrics
