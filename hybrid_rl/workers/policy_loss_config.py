"""``actor.policy_loss.*``: which registered policy loss the actor trains with, and the settings of
the losses that have their own (veRL's key names and defaults)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from hybrid_rl.utils.bounds import bounded, check_bounds

__all__ = ["PolicyLossConfig"]


@dataclass(kw_only=True)
class PolicyLossConfig:
    """Choice of the policy-gradient loss (veRL ``actor.policy_loss.*``)."""

    loss_mode: str = "vanilla"
    """Name in hybrid_rl.algorithms' policy-loss registry (``--help`` lists the registered ones and
    what each needs; ``@hybrid_rl.algorithms.register_policy_loss`` adds one)."""
    behav_imp_weight_cap: Optional[float] = bounded(5.0, gt=1, fix="use e.g. 5, or null")
    """decoupled loss (AReaL's name): tokens whose behaviour importance weight pi_prox / pi_behav
    exceeds this are dropped from the loss; must be > 1. Default 5 (AReaL's example setting): a
    token the trained policy now finds over 5x likelier than its sampler did is too stale to
    correct. null keeps every token (weights up to e^20, the log-ratio clamp)."""
    clip_cov_ratio: float = bounded(0.0002, gt=0, le=1, fix="use a share such as 0.0002")
    """clip_cov loss: share of the tokens whose gradient may be detached."""
    clip_cov_lb: float = 1.0
    """clip_cov loss: lower bound of the advantage x log-prob covariance of a detachable token."""
    clip_cov_ub: float = 5.0
    """clip_cov loss: upper bound of that covariance."""
    kl_cov_ratio: float = bounded(0.0002, gt=0, le=1, fix="use a share such as 0.0002")
    """kl_cov loss: share of the tokens (highest covariance first) that get the |log ratio| penalty."""
    ppo_kl_coef: float = bounded(0.1, ge=0, fix="use e.g. 0.1")
    """kl_cov loss: weight of that penalty."""
    dro_beta: Optional[float] = bounded(None, gt=0, fix="use e.g. 0.1")
    """dro loss: weight of its squared log-ratio regulariser (required by dro, e.g. 0.1)."""

    def __post_init__(self) -> None:
        check_bounds(self, "actor.policy_loss")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"actor.policy_loss.clip_cov_lb={self.clip_cov_lb} must be below clip_cov_ub="
                             f"{self.clip_cov_ub}. Fix: e.g. 1.0 and 5.0.")

    def loss_settings(self) -> dict[str, Any]:
        """Every setting but the loss's name, as keywords for the loss function."""
        return {k: v for k, v in asdict(self).items() if k != "loss_mode"}
