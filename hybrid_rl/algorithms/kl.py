"""KL estimators between the policy and the reference policy, and KL-coefficient controllers.

``kl_penalty`` gives per-token estimates of KL(pi || pi_ref) from sampled-token log-probs
(J. Schulman, "Approximating KL divergence", 2020): ``k1`` = log-ratio (unbiased, high variance),
``k2`` = half squared log-ratio, ``k3`` = ``exp(-d) - 1 + d`` with ``d = logprob - ref_logprob``
(unbiased, low variance, always >= 0). Used both as a reward penalty (``use_kl_in_reward``) and
as an actor loss term (``use_kl_loss``).

The controllers follow Ziegler et al. 2019 (arXiv:1909.08593); both expose ``.value`` and
``update(current_kl, n_steps)`` and can be checkpointed with ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

from typing import Any

import torch

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

# k3 clamps, as in veRL: the log-ratio before exp (so exp cannot overflow) and the estimate itself.
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate.

    Args:
        logprob: ``[B, R]`` log-probs of the sampled tokens under the policy.
        ref_logprob: ``[B, R]`` the same under the reference policy.
        kl_penalty: one of :data:`KL_PENALTY_TYPES` (``kl``/``k1``, ``abs``, ``mse``/``k2``,
            ``low_var_kl``/``k3``).

    Returns:
        ``[B, R]`` estimate (not masked; aggregate it with the response mask).
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-_K3_LOG_RATIO_CLAMP, max=_K3_LOG_RATIO_CLAMP)
        k3 = torch.exp(log_ratio) - log_ratio - 1
        return torch.clamp(k3, min=-_K3_VALUE_CLAMP, max=_K3_VALUE_CLAMP)
    raise ValueError(
        f"unknown kl_penalty {kl_penalty!r} (algorithm.kl_penalty / actor.kl_loss_type); "
        f"valid: {list(KL_PENALTY_TYPES)}"
    )


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """``token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)``, all ``[B, R]`` (veRL's helper)."""
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


class FixedKLController:
    """Constant KL coefficient.

    Args:
        kl_coef: the coefficient returned by ``.value``.
    """

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl``.

    ``value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``.

    Args:
        init_kl_coef: starting coefficient.
        target_kl: KL the controller aims for (> 0).
        horizon: number of samples over which a full proportional correction is applied (> 0).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after observing ``current_kl`` over ``n_steps`` samples."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Only the coefficient is training state; target/horizon come from the (possibly edited) config.
        self.value = float(state["value"])


def get_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: float = 10000, **_: Any
) -> FixedKLController | AdaptiveKLController:
    """Build a controller from the fields of ``algorithm.kl_ctrl`` (call with ``**asdict(cfg)``).

    Args:
        type: ``"fixed"`` or ``"adaptive"``.
        kl_coef: (initial) coefficient.
        target_kl, horizon: adaptive-controller parameters.
    """
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {type!r}; valid: ['fixed', 'adaptive']")
