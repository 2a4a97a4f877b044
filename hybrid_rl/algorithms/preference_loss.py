"""Direct preference losses (the DPO family) and their metrics, as TRL computes them.

Inputs are sequence log-probs ``[P]`` of ``P`` (chosen, rejected) pairs under the trained policy
and the frozen reference. With ``logits = (pi_c - pi_r) - (ref_c - ref_r)`` (TRL's ``dpo_loss``;
the reference part is 0 when ``reference_free``), per pair:

* ``sigmoid`` (DPO, Rafailov et al. 2023), with conservative label smoothing ``eps``
  (cDPO): ``-logsigmoid(beta * logits) * (1 - eps) - logsigmoid(-beta * logits) * eps``.
* ``robust`` (Robust DPO, Chowdhury et al. 2024): the unbiased estimate under label noise ``eps``:
  ``(-logsigmoid(beta * logits) * (1 - eps) + logsigmoid(-beta * logits) * eps) / (1 - 2 * eps)``.
* ``hinge`` (SLiC, Zhao et al. 2023): ``relu(1 - beta * logits)``.
* ``ipo`` (IPO, Azar et al. 2023): ``(logits - 1 / (2 * beta)) ** 2``.
* ``simpo`` (SimPO, Meng et al. 2024; TRL's ``CPOTrainer``): reference-free,
  ``logits = (pi_c - pi_r) - gamma / beta``, then the ``sigmoid`` form (so with ``eps = 0``:
  ``-logsigmoid(beta * (pi_c - pi_r) - gamma)``, computed in TRL's order of operations).

``ipo`` and ``simpo`` read length-normalised log-probs (the masked *mean* over the response
tokens, for the reference too), as TRL does (``"ipo" in loss_type`` in ``DPOTrainer``,
``average_log_prob`` in ``CPOTrainer``); the others read masked sums (:data:`LENGTH_NORMALISED`).

Rewards (logged, detached): ``beta * (logps - ref_logps)``; without a reference (``simpo``,
``reference_free``) ``beta * logps`` as TRL's ``CPOTrainer`` logs them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from hybrid_rl.algorithms.masked import masked_sum

__all__ = ["DPO_LOSS_TYPES", "LENGTH_NORMALISED", "REFERENCE_FREE_LOSS_TYPES", "LABEL_SMOOTHING_LOSS_TYPES",
           "dpo_loss", "dpo_metrics", "sequence_log_probs"]

#: TRL's ``loss_type`` names implemented here.
DPO_LOSS_TYPES = ("sigmoid", "robust", "hinge", "ipo", "simpo")
#: Loss types that read length-normalised (mean) sequence log-probs.
LENGTH_NORMALISED = ("ipo", "simpo")
#: Loss types that never read the reference.
REFERENCE_FREE_LOSS_TYPES = ("simpo",)
#: Loss types in which ``label_smoothing`` takes part (TRL ignores it in the others).
LABEL_SMOOTHING_LOSS_TYPES = ("sigmoid", "robust", "simpo")


def sequence_log_probs(log_prob: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Per-row log-prob of the response: the masked sum ``[b]`` (``average``: divided by the row's
    response tokens, TRL's length normalisation; a row without tokens then gives nan, as in TRL).

    Args:
        log_prob: ``[b, R]`` per-token log-probs.
        mask: ``[b, R]`` 1 on the response tokens.
        average: return the masked mean instead of the sum.
    """
    mask = mask.to(log_prob.dtype)
    total = masked_sum(log_prob, mask, axis=-1)  # [b]
    return total / mask.sum(-1) if average else total


def _check_shapes(**tensors: Optional[torch.Tensor]) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1 or any(len(s) != 1 for s in shapes.values()):
        raise ValueError(f"dpo_loss takes [P] sequence log-probs of equal shape, got {shapes}")


def _smoothed_sigmoid(scaled: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """TRL's ``sigmoid`` loss on ``scaled = beta * logits`` ``[P]``."""
    return -F.logsigmoid(scaled) * (1 - label_smoothing) - F.logsigmoid(-scaled) * label_smoothing


def _pair_losses(logits: torch.Tensor, beta: float, loss_type: str, label_smoothing: float) -> torch.Tensor:
    """The per-pair loss ``[P]`` of ``loss_type`` at ``logits`` ``[P]`` (simpo's gamma already applied)."""
    if loss_type in ("sigmoid", "simpo"):
        return _smoothed_sigmoid(beta * logits, label_smoothing)
    if loss_type == "robust":
        return (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                + F.logsigmoid(-beta * logits) * label_smoothing) / (1 - 2 * label_smoothing)
    if loss_type == "hinge":
        return torch.relu(1 - beta * logits)
    if loss_type == "ipo":  # eq. 17 of the IPO paper; beta is its tau
        return (logits - 1 / (2 * beta)) ** 2
    raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {list(DPO_LOSS_TYPES)}")


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: Optional[torch.Tensor] = None, ref_rejected_logps: Optional[torch.Tensor] = None,
             *, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             simpo_gamma: float = 0.5, reference_free: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(losses [P], chosen_rewards [P], rejected_rewards [P])`` of ``P`` pairs (see the module docstring).

    Args:
        policy_chosen_logps, policy_rejected_logps: ``[P]`` sequence log-probs under the policy (with grad).
        ref_chosen_logps, ref_rejected_logps: ``[P]`` the same under the reference; not read (may be
            None) for ``simpo`` or ``reference_free``.
        beta: inverse temperature (TRL's default 0.1); IPO's ``tau``.
        loss_type: one of :data:`DPO_LOSS_TYPES`.
        label_smoothing: probability that a label is flipped, in ``[0, 0.5)`` (sigmoid, robust, simpo).
        simpo_gamma: SimPO's target reward margin (TRL's default 0.5).
        reference_free: ignore the reference (an implicit uniform reference).

    Returns:
        The per-pair losses (with grad) and the detached implicit rewards.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {list(DPO_LOSS_TYPES)}")
    no_reference = reference_free or loss_type in REFERENCE_FREE_LOSS_TYPES
    if not no_reference and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"dpo_loss with loss_type={loss_type!r} needs the reference log-probs "
                         "(or reference_free=True)")
    refs = (None, None) if no_reference else (ref_chosen_logps, ref_rejected_logps)
    _check_shapes(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                  ref_chosen_logps=refs[0], ref_rejected_logps=refs[1])
    logits = policy_chosen_logps - policy_rejected_logps  # [P]
    if loss_type == "simpo":
        logits = logits - simpo_gamma / beta
    elif not no_reference:
        logits = logits - (ref_chosen_logps - ref_rejected_logps)
    losses = _pair_losses(logits, beta, loss_type, label_smoothing)
    if no_reference:
        chosen_rewards = beta * policy_chosen_logps.detach()
        rejected_rewards = beta * policy_rejected_logps.detach()
    else:
        chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps).detach()
        rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def dpo_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, policy_chosen_logps: torch.Tensor,
                policy_rejected_logps: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's DPO metrics over ``P`` pairs (``[P]`` each), as detached 0-dim tensors (no host sync):
    ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies`` (chosen reward strictly above
    rejected), ``rewards/margins``, ``logps/chosen``, ``logps/rejected`` (means over the pairs)."""
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).to(chosen_rewards.dtype).mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": policy_chosen_logps.detach().mean(),
        "logps/rejected": policy_rejected_logps.detach().mean(),
    }
