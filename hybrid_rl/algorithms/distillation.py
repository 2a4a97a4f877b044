"""On-policy distillation losses (veRL 0.9's ``distillation.distillation_loss``), pure math.

The student samples; a teacher scores every sampled token; the student is trained towards the
teacher on its own samples. Per response token (``[B, R]``), with ``s`` the student's log-prob of the
sampled token (with gradient) and ``t`` the teacher's:

* single-sample estimators on the sampled token, registered under veRL's names:
  ``kl``/``k1`` = s - t, ``abs`` = |s - t|, ``mse``/``k2`` = (s - t)^2 / 2, ``low_var_kl``/``k3`` =
  e^d - d - 1 with d = t - s (:func:`~hybrid_rl.algorithms.kl.kl_penalty`, the reference KL's code).
  Their values estimate the reverse KL(student || teacher) (k1, k3 unbiased), but backpropagated on
  the student's own samples their gradients differ: in expectation k1's is 0, k2's the reverse KL's,
  k3's the **forward** KL(teacher || student)'s, abs's twice the total variation's
  (docs/distillation.md, tests/algorithms/test_distillation_gradients.py);
* ``forward_kl_topk``: the teacher's top-K token ids and log-probs p_k at each position, the
  student's log-softmax q gathered at those ids: L = sum_k e^{p_k} (p_k - q_k), clamped at 0 from below
  (the top-K masses do not sum to 1, so the sum can be negative).

:func:`distillation_token_loss` clamps the per-token loss to +-``loss_max_clamp``. How it trains the
student (:func:`distillation_objective`): directly, aggregated like the policy loss
(``loss_agg_mode``), or, with ``use_policy_gradient``, as a per-token reward: advantage = -loss
(detached) into the vanilla clipped PPO loss (Thinking Machines' on-policy distillation). k1's
gradient does not depend on the teacher, so k1 without policy gradient is refused.

Entries describe themselves (:class:`DistillationLossInfo`: an estimator needs the teacher's log-prob
of the sampled token; a top-K loss needs its top-K ids and log-probs); users register their own with
:func:`register_distillation_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from hybrid_rl.algorithms.kl import kl_penalty
from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.utils.registry import Registry, first_doc_line

__all__ = ["DistillationLossInfo", "describe_distillation_losses", "distillation_loss_info",
           "distillation_objective", "distillation_token_loss", "forward_kl_topk", "get_distillation_loss_fn",
           "register_distillation_loss", "registered_distillation_losses", "topk_log_probs",
           "unregister_distillation_loss"]


@dataclass(frozen=True)
class DistillationLossInfo:
    """What a distillation loss needs from the teacher pass; the trainer and the checks read it."""

    use_topk: bool = False
    """It reads the teacher's top-K ids and log-probs per response position (``teacher_topk_ids``,
    ``teacher_topk_log_probs`` ``[B, R, K]``) and the student's full logits there."""
    use_estimator: bool = False
    """It reads the teacher's log-prob of each sampled token (``teacher_log_prob`` ``[B, R]``)."""
    needs_policy_gradient: bool = False
    """Its gradient is not a KL gradient when backpropagated directly (k1): it trains only as a
    reward (``use_policy_gradient=true``)."""
    description: str = ""
    """One line for ``--help`` pages and the studio."""


_REGISTRY: Registry[DistillationLossInfo] = Registry("distillation loss",
                                                     "distillation.distillation_loss.loss_mode")


def register_distillation_loss(name: str, *, use_topk: bool = False, needs_policy_gradient: bool = False,
                               description: Optional[str] = None) -> Callable:
    """Decorator registering a per-token distillation loss ``fn(student, teacher, **settings) -> [B, R]``
    (an estimator gets log-prob tensors ``[B, R]``; a top-K loss ``(student_topk_log_probs,
    teacher_topk_log_probs)`` ``[B, R, K]``)."""

    def decorator(fn: Callable) -> Callable:
        info = DistillationLossInfo(use_topk=use_topk, use_estimator=not use_topk,
                                    needs_policy_gradient=needs_policy_gradient,
                                    description=description or first_doc_line(fn))
        return _REGISTRY.register(name, info)(fn)

    return decorator


def distillation_loss_info(name: str) -> DistillationLossInfo:
    """What the loss registered as ``name`` needs; unknown names raise ValueError listing the valid ones."""
    return _REGISTRY.info(name)


def describe_distillation_losses() -> dict[str, DistillationLossInfo]:
    """Every registered distillation loss's :class:`DistillationLossInfo`, by name."""
    return _REGISTRY.describe()


def get_distillation_loss_fn(name: str) -> Callable:
    """The loss registered as ``name``; unknown names raise ValueError listing the registered ones."""
    return _REGISTRY.get(name)


def registered_distillation_losses() -> list[str]:
    """Registered names, sorted."""
    return _REGISTRY.names()


def unregister_distillation_loss(name: str) -> None:
    """Remove a registered loss (tests, plugin reloads); a no-op for unknown names."""
    _REGISTRY.unregister(name)


def _estimator(mode: str, description: str, needs_policy_gradient: bool = False) -> None:
    def loss(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, **_: Any) -> torch.Tensor:
        return kl_penalty(student_log_prob, teacher_log_prob, mode)

    loss.__name__ = f"distillation_{mode}"
    register_distillation_loss(mode, needs_policy_gradient=needs_policy_gradient, description=description)(loss)


for _mode, _text, _pg in (
        ("kl", "k1 = s - t: the reverse KL's plain estimator; a reward only (use_policy_gradient).", True),
        ("k1", "k1 = s - t: the reverse KL's plain estimator; a reward only (use_policy_gradient).", True),
        ("abs", "|s - t|: its gradient descends the total variation.", False),
        ("mse", "k2 = (s - t)^2 / 2: its gradient descends the reverse KL.", False),
        ("k2", "k2 = (s - t)^2 / 2: its gradient descends the reverse KL.", False),
        ("low_var_kl", "k3 = e^(t-s) - (t-s) - 1 (veRL's default): its gradient descends the forward KL.", False),
        ("k3", "k3 = e^(t-s) - (t-s) - 1 (veRL's default): its gradient descends the forward KL.", False)):
    _estimator(_mode, _text, _pg)


def topk_log_probs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``ids``, in float32 at least (with gradient).

    Args:
        logits: ``[N, V]`` the student's logits at the response positions.
        ids: ``[N, K]`` the teacher's top-K token ids there.

    Returns:
        ``[N, K]`` = z[ids] - logsumexp(z), z = logits / temperature, without a ``[N, V]`` float32
        log-softmax kept for backward beyond the logsumexp's own.
    """
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    return z.gather(-1, ids) - torch.logsumexp(z, dim=-1, keepdim=True)


@register_distillation_loss("forward_kl_topk", use_topk=True)
def forward_kl_topk(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, *,
                    log_prob_min_clamp: Optional[float] = None, **_: Any) -> torch.Tensor:
    """Forward KL(teacher || student) over the teacher's top-K tokens, sum_k e^{p_k}(p_k - q_k) >= 0.

    Args:
        student_topk_log_probs: ``[B, R, K]`` q, the student's log-probs of the teacher's top-K ids.
        teacher_topk_log_probs: ``[B, R, K]`` p, the teacher's.
        log_prob_min_clamp: both are clamped from below first (None: no clamp).

    Returns:
        ``[B, R]``, clamped at 0 from below (the top-K masses do not sum to 1).
    """
    dtype = torch.promote_types(student_topk_log_probs.dtype, torch.float32)  # float32, or float64 kept
    q, p = student_topk_log_probs.to(dtype), teacher_topk_log_probs.to(dtype)
    if log_prob_min_clamp is not None:
        q, p = q.clamp_min(log_prob_min_clamp), p.clamp_min(log_prob_min_clamp)
    return (p.exp() * (p - q)).sum(-1).clamp_min(0.0)


def distillation_token_loss(loss_mode: str, student: torch.Tensor, teacher: torch.Tensor, *,
                            loss_max_clamp: Optional[float] = None,
                            log_prob_min_clamp: Optional[float] = None) -> torch.Tensor:
    """The registered loss ``loss_mode`` per response token ``[B, R]``, clamped to
    ``[-loss_max_clamp, loss_max_clamp]`` (None: unclamped). ``student`` / ``teacher``: log-probs
    ``[B, R]`` for an estimator, top-K log-probs ``[B, R, K]`` for a top-K loss."""
    losses = get_distillation_loss_fn(loss_mode)(student, teacher, log_prob_min_clamp=log_prob_min_clamp)
    if loss_max_clamp is not None:
        losses = losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    return losses


def distillation_objective(losses: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                           response_mask: torch.Tensor, *, use_policy_gradient: bool, loss_agg_mode: str,
                           clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                           global_batch_num_tokens: Any = None, global_batch_num_seqs: Any = None,
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(scalar loss to minimise, metrics)`` from per-token distillation ``losses`` ``[B, R]``.

    Directly: ``agg_loss(losses)``. With ``use_policy_gradient``: vanilla clipped PPO with
    advantages = -losses (detached), ratio exp(log_prob - old_log_prob); its clip fraction and KL are
    returned as ``distillation/pg_clipfrac`` and ``distillation/ppo_kl``.
    """
    agg = dict(loss_agg_mode=loss_agg_mode, global_batch_num_tokens=global_batch_num_tokens,
               global_batch_num_seqs=global_batch_num_seqs)
    if not use_policy_gradient:
        return agg_loss(losses, response_mask, loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs), {}
    from hybrid_rl.algorithms.policy_loss import get_policy_loss_fn

    pg_loss, clipfrac, ppo_kl, _ = get_policy_loss_fn("vanilla")(
        old_log_prob, log_prob, -losses.detach(), response_mask, clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high, **agg)
    return pg_loss, {"distillation/pg_clipfrac": clipfrac.detach(), "distillation/ppo_kl": ppo_kl.detach()}
