"""The policy losses veRL ships beside PPO's and GSPO's, registered under veRL's names.

Same uniform signature as :mod:`hybrid_rl.algorithms.policy_loss` (``[B, R]`` tensors in, 0-dim
``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` out; ``rollout_is_weights`` multiplies each
token's loss before aggregation). Each loss's own settings arrive as keywords with veRL's key names
(``actor.policy_loss.*``: ``clip_cov_ratio``, ``kl_cov_ratio``, ``ppo_kl_coef``, ``dro_beta``;
``actor.tau_pos`` / ``tau_neg``), which the actor passes from its config. With ``r = pi / pi_old``
per token (``log r`` clamped to +-20 where veRL clamps it):

* ``gpg``: ``-A * log pi`` (no ratio).
* ``cispo``: ``-sg(clip(r, 1 - low, 1 + high)) * A * log pi`` (MiniMax-M1): every token keeps a
  gradient, the clipped ratio only weights it.
* ``sapo``: soft-gated ``-A * sigmoid(tau (r - 1)) * 4 / tau`` with ``tau_pos`` / ``tau_neg`` by the
  advantage's sign; always aggregated seq-mean-token-mean (as veRL).
* ``dro``: ``-(A log pi - beta/2 (log r)^2)`` (``dro_beta``).
* ``dppo_tv`` / ``dppo_kl``: ``-A * sg(min(r, clip_ratio_c)) * log pi`` on the tokens whose
  probability moved less than the thresholds (``clip_ratio_low/high`` read as divergence bounds: the
  total-variation ``p - p_old``, or the binary KL between p_old and p); others get no gradient.
* ``clip_cov``: PPO's clipped surrogate, with a random ``clip_cov_ratio`` share of the unclipped tokens
  whose centred advantage x log-prob covariance lies in ``(clip_cov_lb, clip_cov_ub)`` detached
  (Cui et al. 2025); the draw uses torch's global RNG, as veRL.
* ``kl_cov``: ``-A r``, plus ``ppo_kl_coef * |log r|`` on the top ``kl_cov_ratio`` share of tokens by
  that covariance.
* ``geo_mean`` (GMPO): per sequence ``-mean_t(A) * exp(mean_t(clip(log r)))``, clipped in log space
  by the advantage's sign; averaged over sequences.

``clip_cov`` and ``kl_cov`` select tokens within each micro-batch (as veRL), so unlike the others
their updates depend on the micro-batch split.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.algorithms.masked import masked_mean
from hybrid_rl.algorithms.policy_loss import LOG_RATIO_CLAMP, register_policy_loss

__all__ = ["compute_policy_loss_cispo", "compute_policy_loss_clip_cov", "compute_policy_loss_dppo_kl",
           "compute_policy_loss_dppo_tv", "compute_policy_loss_dro", "compute_policy_loss_geo_mean",
           "compute_policy_loss_gpg", "compute_policy_loss_kl_cov", "compute_policy_loss_sapo"]

Metrics = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _finish(pg_losses: torch.Tensor, mask: torch.Tensor, weights: Optional[torch.Tensor], mode: str,
            tokens: Any, seqs: Any, clipfrac: Any = 0.0, ppo_kl: Any = 0.0, clipfrac_lower: Any = 0.0) -> Metrics:
    """Weight, aggregate, and return the loss with its three metrics as 0-dim tensors."""
    if weights is not None:
        pg_losses = pg_losses * weights
    loss = agg_loss(pg_losses, mask, mode, tokens, seqs)

    def scalar(value: Any) -> torch.Tensor:
        return torch.as_tensor(value, dtype=loss.dtype, device=loss.device).detach()

    return loss, scalar(clipfrac), scalar(ppo_kl), scalar(clipfrac_lower)


def _log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    log_ratio = log_prob - old_log_prob
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if clamp else log_ratio


@register_policy_loss("gpg", applies_rollout_is_weights=True)
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                            loss_agg_mode: str = "token-mean", global_batch_num_tokens=None,
                            global_batch_num_seqs=None, **kwargs) -> Metrics:
    """GPG (Chu et al. 2025): the plain policy gradient ``-A * log pi``, no ratio or clipping."""
    return _finish(-log_prob * advantages, response_mask, rollout_is_weights, loss_agg_mode,
                   global_batch_num_tokens, global_batch_num_seqs)


@register_policy_loss("cispo", applies_rollout_is_weights=True)
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                              loss_agg_mode: str = "token-mean", clip_ratio_low: float = 0.2,
                              clip_ratio_high: float = 0.2, global_batch_num_tokens=None,
                              global_batch_num_seqs=None, **kwargs) -> Metrics:
    """CISPO (MiniMax-M1): the clipped importance ratio, detached, weights ``-A * log pi``."""
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = -clipped.detach() * advantages * log_prob
    return _finish(pg_losses, response_mask, rollout_is_weights, loss_agg_mode, global_batch_num_tokens,
                   global_batch_num_seqs, masked_mean((ratio != clipped).to(ratio.dtype), response_mask),
                   masked_mean(-log_ratio.detach(), response_mask))


@register_policy_loss("sapo", applies_rollout_is_weights=True)
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                             tau_pos: float = 1.0, tau_neg: float = 1.05, global_batch_num_tokens=None,
                             global_batch_num_seqs=None, **kwargs) -> Metrics:
    """SAPO: a soft sigmoid gate on the ratio instead of a hard clip (``actor.tau_pos`` / ``tau_neg``)."""
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return _finish(-gate * advantages, response_mask, rollout_is_weights, "seq-mean-token-mean",
                   global_batch_num_tokens, global_batch_num_seqs, ppo_kl=masked_mean(-log_ratio.detach(), response_mask))


@register_policy_loss("dro", applies_rollout_is_weights=True,
                      requires=("actor_rollout_ref.actor.policy_loss.dro_beta",))
def compute_policy_loss_dro(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                            dro_beta: Optional[float] = None, loss_agg_mode: str = "token-mean",
                            global_batch_num_tokens=None, global_batch_num_seqs=None, **kwargs) -> Metrics:
    """DRO: ``-(A log pi - beta/2 (log pi - log pi_old)^2)`` (``actor.policy_loss.dro_beta``)."""
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"actor.policy_loss.loss_mode=dro needs actor.policy_loss.dro_beta > 0, got {dro_beta}; "
                         "set e.g. dro_beta=0.1.")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio ** 2)
    return _finish(pg_losses, response_mask, rollout_is_weights, loss_agg_mode, global_batch_num_tokens,
                   global_batch_num_seqs, ppo_kl=masked_mean(-log_ratio.detach(), response_mask))


def _dppo(old_log_prob, log_prob, advantages, response_mask, valid_fn, *, rollout_is_weights, loss_agg_mode,
          clip_ratio_c, global_batch_num_tokens, global_batch_num_seqs) -> Metrics:
    """DPPO's shared body: the truncated ratio weights ``-A log pi`` on the tokens ``valid_fn`` keeps."""
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    keep_pos, keep_neg = valid_fn(p, p_old)
    valid = torch.where(advantages > 0, keep_pos, keep_neg).detach().to(log_prob.dtype)
    pg_losses = -advantages * truncated * log_prob * valid
    return _finish(pg_losses, response_mask, rollout_is_weights, loss_agg_mode, global_batch_num_tokens,
                   global_batch_num_seqs, masked_mean(1 - valid, response_mask),
                   masked_mean(-log_ratio.detach(), response_mask),
                   masked_mean(((ratio > clip_ratio_c).to(valid.dtype) * valid).detach(), response_mask))


@register_policy_loss("dppo_tv", applies_rollout_is_weights=True)
def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                                loss_agg_mode: str = "token-mean", clip_ratio_low: float = 0.2,
                                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0, global_batch_num_tokens=None,
                                global_batch_num_seqs=None, **kwargs) -> Metrics:
    """DPPO-TV: tokens whose probability rose by more than ``clip_ratio_high`` (A > 0) or fell by more
    than ``clip_ratio_low`` (A < 0) get no gradient."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask,
                 lambda p, p_old: ((p - p_old) <= clip_ratio_high, (p - p_old) >= -clip_ratio_low),
                 rollout_is_weights=rollout_is_weights, loss_agg_mode=loss_agg_mode, clip_ratio_c=clip_ratio_c,
                 global_batch_num_tokens=global_batch_num_tokens, global_batch_num_seqs=global_batch_num_seqs)


@register_policy_loss("dppo_kl", applies_rollout_is_weights=True)
def compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                                loss_agg_mode: str = "token-mean", clip_ratio_low: float = 0.2,
                                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0, global_batch_num_tokens=None,
                                global_batch_num_seqs=None, **kwargs) -> Metrics:
    """DPPO-KL: as DPPO-TV with the binary KL between p_old and p as the divergence."""
    def keep(p, p_old):
        bkl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        return (bkl <= clip_ratio_high) | (p <= p_old), (bkl <= clip_ratio_low) | (p >= p_old)

    return _dppo(old_log_prob, log_prob, advantages, response_mask, keep, rollout_is_weights=rollout_is_weights,
                 loss_agg_mode=loss_agg_mode, clip_ratio_c=clip_ratio_c,
                 global_batch_num_tokens=global_batch_num_tokens, global_batch_num_seqs=global_batch_num_seqs)


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(A - mean A) * (log pi - mean log pi)`` per token ``[B, R]`` (means over this call's tokens)."""
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob.detach(), mask))


@register_policy_loss("clip_cov", applies_rollout_is_weights=True)
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                                 loss_agg_mode: str = "token-mean", clip_ratio_low: float = 0.2,
                                 clip_ratio_high: float = 0.2, clip_cov_ratio: float = 0.0002,
                                 clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0, global_batch_num_tokens=None,
                                 global_batch_num_seqs=None, **kwargs) -> Metrics:
    """Clip-Cov: PPO's clipped surrogate with a random share of high-covariance tokens detached."""
    if clip_cov_ratio <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio={clip_cov_ratio} must be > 0 (e.g. 0.0002).")
    mask = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    cov = _covariance(advantages, log_prob, response_mask).detach()
    eligible = mask & ~(pg2 > pg1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    candidates = torch.nonzero(eligible)  # [K, 2], row-major
    keep = torch.ones_like(advantages)
    if len(candidates):
        count = max(int(clip_cov_ratio * float(mask.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:count]]
        keep[chosen[:, 0], chosen[:, 1]] = 0
    pg_losses = torch.maximum(pg1, pg2) * keep
    return _finish(pg_losses, response_mask, rollout_is_weights, loss_agg_mode, global_batch_num_tokens,
                   global_batch_num_seqs, masked_mean((keep == 0).to(ratio.dtype), response_mask),
                   masked_mean(-log_ratio.detach(), response_mask))


@register_policy_loss("kl_cov", applies_rollout_is_weights=True)
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                               loss_agg_mode: str = "token-mean", kl_cov_ratio: float = 0.0002,
                               ppo_kl_coef: float = 0.1, global_batch_num_tokens=None, global_batch_num_seqs=None,
                               **kwargs) -> Metrics:
    """KL-Cov: ``-A r``, plus a ``|log r|`` penalty on the top share of tokens by covariance."""
    if kl_cov_ratio <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio={kl_cov_ratio} must be > 0 (e.g. 0.0002).")
    log_ratio = log_prob - old_log_prob
    pg_losses = -advantages * torch.exp(log_ratio)
    mask = response_mask.bool()
    flat = torch.nonzero(mask.reshape(-1)).squeeze(-1)  # row-major indices of the valid tokens
    if flat.numel():
        adv, lp = advantages[mask].detach(), log_prob[mask].detach()
        cov = (adv - adv.mean()) * (lp - lp.mean())
        top = flat[torch.topk(cov, max(1, int(flat.numel() * kl_cov_ratio))).indices]
        penalty = torch.zeros_like(pg_losses).reshape(-1)
        penalty[top] = 1.0
        pg_losses = pg_losses + ppo_kl_coef * log_ratio.abs() * penalty.view_as(pg_losses)
    return _finish(pg_losses, response_mask, rollout_is_weights, loss_agg_mode, global_batch_num_tokens,
                   global_batch_num_seqs, ppo_kl=masked_mean(log_ratio.detach().abs(), response_mask))


@register_policy_loss("geo_mean", applies_rollout_is_weights=True)
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, *, rollout_is_weights=None,
                                 clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                                 global_batch_num_seqs=None, **kwargs) -> Metrics:
    """GMPO: the geometric mean of the token ratios per sequence, clipped in log space by the sign of
    the advantage, times the sequence's mean advantage; averaged over sequences."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    bounded = sign * torch.minimum(sign * log_ratio, sign * clipped)  # A > 0: min(x, high); A < 0: max(x, -low)
    length = mask.sum(-1)
    seq_ratio = torch.exp((bounded * mask).sum(-1) / (length + 1e-8))  # [B]
    seq_adv = (advantages * mask).sum(-1) / (length + 1e-8)
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:  # the sequences' geometric-mean weights
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(-1) / (length + 1e-8))
    rows = (length > 0).to(log_prob.dtype)
    loss = agg_loss(seq_loss.unsqueeze(-1), rows.unsqueeze(-1), "seq-mean-token-sum", None, global_batch_num_seqs)
    hit = (log_ratio != clipped).to(log_prob.dtype)
    return (loss, masked_mean(hit * (advantages > 0), response_mask).detach(),
            masked_mean(-log_ratio.detach(), response_mask), masked_mean(hit * (advantages < 0), response_mask).detach())
