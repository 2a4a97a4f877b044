"""Rollout correction: the trainer-vs-rollout mismatch, measured and corrected (veRL's
``algorithm.rollout_correction``).

The rollout engine samples with its own kernels and dtype, so the log-probs it samples with
(``rollout_log_probs``, pi_rollout) differ from the trainer's (``old_log_probs``, pi_train): "on-policy"
PPO is slightly off-policy. With ``log_ratio = log pi_train - log pi_rollout`` per token (clamped to
+-:data:`SAFETY_BOUND` before ``exp``):

* **importance sampling** (``rollout_is``): ``token`` weights ``w_t = exp(log_ratio_t)``; ``sequence``
  weights ``w = exp(sum_t log_ratio_t)`` broadcast over the sequence. A float ``rollout_is_threshold``
  truncates (TIS: ``min(w, threshold)``); a ``"lower_upper"`` string masks weights outside
  ``[lower, upper]`` to 0 (MIS / IcePop). Optionally normalised to mean 1 over the batch. Detached:
  the weights scale each token's policy-gradient loss, they carry no gradient.
* **rejection sampling** (``rollout_rs``, a comma list of ``{token, seq_sum, seq_mean, seq_max}_{k1,k2,k3}``):
  a token or sequence whose divergence statistic leaves its bounds is dropped from the loss (its
  ``response_mask`` entries become 0). ``k1 = -log_ratio`` must lie in ``[log lower, log upper]``
  (threshold ``"lower_upper"`` or ``upper`` alone, lower = 1/upper); ``k2 = log_ratio^2 / 2`` and
  ``k3 = exp(log_ratio) - 1 - log_ratio`` must stay <= the threshold. Every listed criterion must pass.
* **bypass mode**: the rollout's log-probs are the old log-probs (no recomputation pass); the loss
  recomputes the weights and rejections against the current policy at every micro-batch
  (:func:`bypass_policy_loss`: ``ppo_clip`` = PPO's clipped surrogate against pi_rollout,
  ``reinforce`` = ``-A * w * log pi``).

All tensors are ``[B, R]`` (rows x response tokens) unless said otherwise; metrics are floats under
veRL's names (``rollout_corr/...``), computed as veRL 0.9.1 computes them
(:mod:`hybrid_rl.algorithms.rollout_correction_metrics`). Pure math: no config objects beyond
:class:`RolloutCorrectionConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Optional

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.algorithms.masked import masked_mean
from hybrid_rl.algorithms.rollout_correction_metrics import (SAFETY_BOUND, host, is_metrics, masked_max, mmean, msum,
                                                             offpolicy_metrics, rs_metrics)

__all__ = ["ROLLOUT_CORRECTION_PRESETS", "RS_OPTIONS", "RolloutCorrectionConfig", "SAFETY_BOUND", "RejectionSpec",
           "bypass_policy_loss", "compute_rollout_correction", "offpolicy_metrics", "parse_is_threshold",
           "parse_rejection_specs", "rejection_mask", "rollout_is_weights"]

RS_OPTIONS = tuple(f"{level}_{k}" for level in ("token", "seq_sum", "seq_mean", "seq_max") for k in ("k1", "k2", "k3")
                   if (level, k) != ("seq_max", "k1"))
"""The rejection criteria (a sequence's largest ``k1`` bounds nothing useful: veRL has no ``seq_max_k1``)."""

LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass
class RolloutCorrectionConfig:
    """Correcting the rollout-vs-trainer mismatch (veRL's ``algorithm.rollout_correction.*``); needs the
    engine's log-probs (``actor_rollout_ref.rollout.calculate_log_probs=true``)."""

    preset: Optional[str] = None
    """One key for a published setting (hybrid_rl's key; veRL's preset constructors): tis, token_tis, mis,
    icepop, seq_is_rs, geo_rs, geo_rs_seq_tis, geo_rs_token_tis, k3_rs, k3_rs_seq_tis, k3_rs_token_tis,
    bypass_ppo_clip, bypass_ppo_clip_geo_rs, bypass_ppo_clip_k3_rs, bypass_pg_is, bypass_pg_geo_rs, or
    metrics (measure the mismatch only: the old log-probs are recomputed every step). It fills the keys
    below that are left at their defaults."""
    rollout_is: Optional[str] = None
    """Importance weights pi_train / pi_rollout per ``token`` or per ``sequence`` (product over its
    tokens); null = none."""
    rollout_is_threshold: Any = 2.0
    """A number: truncate the weights at it (TIS). A string ``"lower_upper"`` (e.g. ``"0.5_2.0"``): weights
    outside [lower, upper] become 0 (masked IS, IcePop)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (over tokens, or sequences for ``sequence``) so they average 1."""
    rollout_rs: Optional[str] = None
    """Rejection sampling: a comma list of criteria ``{token,seq_sum,seq_mean,seq_max}_{k1,k2,k3}``
    (e.g. ``seq_mean_k3`` or ``token_k1,seq_max_k2``); a token or sequence failing one leaves the loss.
    null = none."""
    rollout_rs_threshold: Any = None
    """Bounds of the criteria: one value for all or a comma list, one per criterion. k1: ``"lower_upper"``
    on pi_rollout / pi_train (or ``upper`` alone, lower = 1/upper); k2/k3: an upper bound."""
    bypass_mode: bool = False
    """Use the rollout's log-probs as the old log-probs (skips the trainer's old-log-prob pass); the loss
    recomputes weights and rejections against the current policy (``loss_type``)."""
    loss_type: str = "ppo_clip"
    """Bypass mode's loss: ppo_clip (PPO's clipped surrogate against pi_rollout) | reinforce
    (-A * w * log pi, w the ``rollout_is`` weight or 1)."""

    @property
    def enabled(self) -> bool:
        """Whether anything is corrected (weights, rejections or bypass); else metrics only."""
        return bool(self.rollout_is or self.rollout_rs or self.bypass_mode)

    @property
    def measured(self) -> bool:
        """Whether the run measures the mismatch every step (a correction, or the ``metrics`` preset):
        the trainer then recomputes the old log-probs even when its update would not need them."""
        return self.enabled or self.preset == "metrics"


ROLLOUT_CORRECTION_PRESETS: dict[str, dict[str, Any]] = {
    "metrics": {},
    "tis": dict(rollout_is="sequence", rollout_is_threshold=2.0),
    "token_tis": dict(rollout_is="token", rollout_is_threshold=2.0),
    "mis": dict(rollout_is="sequence", rollout_is_threshold="0.5_2.0"),
    "icepop": dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
    "seq_is_rs": dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_sum_k1",
                      rollout_rs_threshold="0.5_2.0"),
    "geo_rs": dict(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"),
    "geo_rs_seq_tis": dict(rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"),
    "geo_rs_token_tis": dict(rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"),
    "k3_rs": dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "k3_rs_seq_tis": dict(rollout_is="sequence", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "k3_rs_token_tis": dict(rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "bypass_ppo_clip": dict(bypass_mode=True, loss_type="ppo_clip"),
    "bypass_ppo_clip_geo_rs": dict(bypass_mode=True, loss_type="ppo_clip", rollout_rs="seq_mean_k1",
                                   rollout_rs_threshold="0.999_1.001"),
    "bypass_ppo_clip_k3_rs": dict(bypass_mode=True, loss_type="ppo_clip", rollout_rs="seq_mean_k3",
                                  rollout_rs_threshold=0.01),
    "bypass_pg_is": dict(bypass_mode=True, loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=2.0),
    "bypass_pg_geo_rs": dict(bypass_mode=True, loss_type="reinforce", rollout_rs="seq_mean_k1",
                             rollout_rs_threshold="0.999_1.001"),
}
"""``preset -> the keys it sets`` (veRL's ``RolloutCorrectionConfig`` constructors; ``mis`` / ``icepop``
are the masked-IS settings of the IcePop paper and OpenRLHF)."""


def resolve_preset(cfg: RolloutCorrectionConfig) -> RolloutCorrectionConfig:
    """``cfg`` with its preset's keys filled in where ``cfg`` leaves them at their defaults (a key set
    away from its default wins); ValueError for an unknown preset."""
    if cfg.preset is None:
        return cfg
    if cfg.preset not in ROLLOUT_CORRECTION_PRESETS:
        raise ValueError(f"algorithm.rollout_correction.preset={cfg.preset!r} is not a preset; use one of "
                         f"{sorted(ROLLOUT_CORRECTION_PRESETS)} or null.")
    default = RolloutCorrectionConfig()
    unset = {f.name for f in fields(cfg) if getattr(cfg, f.name) == getattr(default, f.name)}
    return replace(cfg, **{k: v for k, v in ROLLOUT_CORRECTION_PRESETS[cfg.preset].items() if k in unset})


def parse_is_threshold(value: Any) -> tuple[Optional[float], float]:
    """``(lower, upper)`` of ``rollout_is_threshold``: a number truncates (lower None), ``"L_U"`` masks."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    if isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is a boolean; give a number (truncation, e.g. 2.0) or 'lower_upper'.")
    if isinstance(value, str) and "_" in value:
        lower, upper = _floats(value.split("_", 1), key)
        if not 0 < lower <= upper:
            raise ValueError(f"{key}={value!r}: need 0 < lower <= upper, e.g. '0.5_2.0'.")
        return lower, upper
    (upper,) = _floats([value], key)
    if upper <= 0:
        raise ValueError(f"{key}={value!r} must be > 0 (a truncation bound, e.g. 2.0).")
    return None, upper


def _floats(parts: list[Any], key: str) -> list[float]:
    try:
        return [float(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError(f"{key}={'_'.join(map(str, parts))!r} is not a number nor 'lower_upper' "
                         "(e.g. 2.0 or '0.5_2.0').") from None


@dataclass(frozen=True)
class RejectionSpec:
    """One rejection criterion with its bounds (``lower`` only for k1)."""

    option: str
    lower: Optional[float]
    upper: float

    @property
    def level(self) -> str:
        return self.option.rsplit("_", 1)[0]

    @property
    def estimator(self) -> str:
        return self.option.rsplit("_", 1)[1]


def parse_rejection_specs(options: Optional[str], thresholds: Any) -> list[RejectionSpec]:
    """The criteria of ``rollout_rs`` with their bounds from ``rollout_rs_threshold`` (see the module
    docstring); [] when ``options`` is null. ValueError naming the key for anything malformed."""
    if not options:
        return []
    key = "algorithm.rollout_correction.rollout_rs"
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    unknown = [n for n in names if n not in RS_OPTIONS]
    if unknown or not names:
        raise ValueError(f"{key}={options!r}: unknown criteria {unknown}; use a comma list of {list(RS_OPTIONS)}.")
    if thresholds is None:
        raise ValueError(f"{key}={options!r} needs algorithm.rollout_correction.rollout_rs_threshold "
                         "(e.g. 0.01 for k3, '0.999_1.001' for k1).")
    values = [t.strip() for t in str(thresholds).split(",") if t.strip()]
    if len(values) not in (1, len(names)):
        raise ValueError(f"algorithm.rollout_correction.rollout_rs_threshold={thresholds!r} gives {len(values)} "
                         f"values for {len(names)} criteria; give one for all or one per criterion.")
    values = values * len(names) if len(values) == 1 else values
    return [_spec(name, value) for name, value in zip(names, values)]


def _spec(option: str, value: str) -> RejectionSpec:
    key = f"algorithm.rollout_correction.rollout_rs_threshold for {option}"
    if option.endswith("k1"):
        lower, upper = _floats(value.split("_", 1), key) if "_" in value else (None, *_floats([value], key))
        lower = 1.0 / upper if lower is None and upper > 0 else lower
        if not (lower > 0 and upper > 0):
            raise ValueError(f"{key}={value!r}: bounds must be > 0 (e.g. '0.999_1.001').")
        if lower > upper:
            raise ValueError(f"{key}={value!r}: need lower <= upper (e.g. '0.999_1.001').")
        return RejectionSpec(option, lower, upper)
    if "_" in value:
        raise ValueError(f"{key}={value!r}: k2/k3 take one upper bound (e.g. 0.01), not 'lower_upper'.")
    (upper,) = _floats([value], key)
    if upper <= 0:
        raise ValueError(f"{key}={value!r} must be > 0.")
    return RejectionSpec(option, None, upper)


def _float(values: torch.Tensor) -> torch.Tensor:
    """Detached, in float32 at least (bf16 log-probs are computed on in float32; float64 stays)."""
    return values.detach().to(torch.promote_types(values.dtype, torch.float32))


def _log_ratio(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor) -> torch.Tensor:
    """``log pi_train - log pi_rollout`` ``[B, R]`` clamped to +-SAFETY_BOUND, detached."""
    return (_float(old_log_prob) - _float(rollout_log_prob)).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def rollout_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       level: str, threshold: Any = 2.0,
                       batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached importance weights ``[B, R]`` (0 off the mask) and veRL 0.9.1's ``rollout_is_*`` metrics
    of the applied weights (:mod:`~hybrid_rl.algorithms.rollout_correction_metrics`).

    Args:
        old_log_prob, rollout_log_prob: ``[B, R]`` log-probs of the sampled tokens under the trainer's
            and the rollout engine's policy.
        response_mask: ``[B, R]`` the tokens that count.
        level: ``token`` or ``sequence``.
        threshold: ``rollout_is_threshold`` (a number: truncate; ``"lower_upper"``: mask outside).
        batch_normalize: divide by the batch mean of the weights (tokens, or sequences).
    """
    lower, upper = parse_is_threshold(threshold)
    log_ratio = _float(old_log_prob) - _float(rollout_log_prob)  # [B, R]
    mask = response_mask.to(log_ratio.dtype)
    if level == "token":
        log_metrics, log_w = log_ratio, log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    elif level == "sequence":
        log_metrics = msum(log_ratio, mask, axis=-1).unsqueeze(-1)  # [B, 1] unclamped, as veRL's metrics
        log_w = log_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND).expand_as(log_ratio)
    else:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r} must be token, sequence or null.")
    raw = torch.exp(log_w) * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = is_metrics(weights, raw, log_metrics, mask, level, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = mmean(((raw < lower) | (raw > upper)).float(), mask)
    if batch_normalize:
        rows = (mask.sum(-1) > 0).to(mask.dtype)
        mean = (mmean(weights, mask) if level == "token"
                else (mmean(weights, mask, axis=-1) * rows).sum() / rows.sum().clamp_min(1e-8))
        factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))  # no host round trip
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights.detach(), host(metrics)


def _divergence(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """``k1 = -r``, ``k2 = r^2 / 2``, ``k3 = exp(r) - 1 - r`` per token (``r = log pi_train/pi_rollout``)."""
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    return torch.exp(log_ratio) - 1.0 - log_ratio


def _per_sequence(per_token: torch.Tensor, mask: torch.Tensor, level: str) -> Optional[torch.Tensor]:
    """The criterion's value per sequence ``[B]`` (0 for a row without tokens); None at token level."""
    if level == "token":
        return None
    if level == "seq_sum":
        return msum(per_token, mask, axis=-1)
    if level == "seq_mean":
        return mmean(per_token, mask, axis=-1)
    return masked_max(per_token, mask, axis=-1)


def rejection_mask(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                   specs: list[RejectionSpec]) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` ``[B, R]`` with every token (or sequence) that fails a criterion of ``specs``
    set to 0, and veRL 0.9.1's ``rollout_rs_*`` metrics."""
    log_ratio = _log_ratio(old_log_prob, rollout_log_prob)
    mask = response_mask.to(log_ratio.dtype)
    keep_all = torch.ones_like(mask)
    rows = mask.sum(-1) > 0
    metrics: dict[str, Any] = {}
    for spec in specs:
        per_token = _divergence(log_ratio, spec.estimator)
        seq = _per_sequence(per_token, mask, spec.level)
        stat = per_token if seq is None else seq.unsqueeze(-1).expand_as(per_token)  # [B, R]
        upper = math.log(spec.upper) if spec.lower is not None else spec.upper
        lower = math.log(spec.lower) if spec.lower is not None else None
        keep = ((stat <= upper) & (stat >= lower if lower is not None else True)).to(mask.dtype)
        keep_all = keep_all * keep
        metrics.update(rs_metrics(spec.option, stat, mask, seq, upper, lower))
        name = f"rollout_rs_{spec.option}"
        metrics[f"{name}_masked_fraction"] = mmean(1 - keep, mask)
        metrics[f"{name}_seq_masked_fraction"] = ((1 - keep) * mask).amax(-1)[rows].mean()
    new_mask = response_mask * keep_all.to(response_mask.dtype)
    metrics["rollout_rs_masked_fraction"] = mmean(1 - keep_all, mask)
    metrics["rollout_rs_seq_masked_fraction"] = ((1 - keep_all) * mask).amax(-1).mean()  # every row, as veRL
    return new_mask, host(metrics)


def compute_rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                               response_mask: torch.Tensor, cfg: RolloutCorrectionConfig,
                               ) -> tuple[Optional[torch.Tensor], torch.Tensor, dict[str, float]]:
    """``(rollout_is_weights [B, R] or None, response_mask after rejection [B, R], rollout_corr/* metrics)``
    of one batch (the weights and rejections use the mask as it came in)."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"rollout correction: old_log_probs {tuple(old_log_prob.shape)}, rollout_log_probs "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} differ.")
    if not bool(response_mask.any()):
        return None, response_mask, {}
    cfg = resolve_preset(cfg)
    metrics = offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
    weights = None
    if cfg.rollout_is:
        weights, is_metrics = rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, cfg.rollout_is,
                                                 cfg.rollout_is_threshold, cfg.rollout_is_batch_normalize)
        metrics.update(is_metrics)
    new_mask, rs_metrics = rejection_mask(old_log_prob, rollout_log_prob, response_mask,
                                          parse_rejection_specs(cfg.rollout_rs, cfg.rollout_rs_threshold))
    if cfg.rollout_rs:
        metrics.update(rs_metrics)
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def bypass_policy_loss(base_loss_fn: Callable, log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                       advantages: torch.Tensor, response_mask: torch.Tensor, cfg: RolloutCorrectionConfig,
                       *, loss_agg_mode: str = "token-mean", global_batch_num_tokens: Any = None,
                       global_batch_num_seqs: Any = None, **loss_kwargs: Any):
    """Bypass mode's policy loss: weights and rejections of the current policy ``log_prob`` against the
    rollout's, recomputed without gradient at every micro-batch (so ``rollout_is_batch_normalize``
    normalises over the micro-batch); then ``ppo_clip`` (``base_loss_fn``, the run's registered loss,
    PPO's clipped surrogate by default, with pi_rollout as the old policy, the rejections masked and
    ``loss_kwargs`` its settings) or ``reinforce`` (``-A * w * log pi``, w the ``rollout_is`` weight or 1).

    Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower, rollout_corr metrics)``; ``reinforce``
    clips nothing and, as veRL's, returns None for both clip fractions (not logged) and ``ppo_kl`` over
    the tokens left after the rejections."""
    cfg = resolve_preset(cfg)
    with torch.no_grad():
        weights, mask, metrics = compute_rollout_correction(log_prob.detach(), rollout_log_prob, response_mask, cfg)
    agg = dict(loss_agg_mode=loss_agg_mode, global_batch_num_tokens=global_batch_num_tokens,
               global_batch_num_seqs=global_batch_num_seqs)
    if cfg.loss_type == "ppo_clip":
        return (*base_loss_fn(rollout_log_prob, log_prob, advantages, mask, **agg, **loss_kwargs), metrics)
    if cfg.loss_type != "reinforce":
        raise ValueError(f"algorithm.rollout_correction.loss_type={cfg.loss_type!r} must be one of {LOSS_TYPES}.")
    scale = weights if weights is not None else torch.ones_like(log_prob)
    pg_loss = agg_loss(-advantages * log_prob * scale, mask, **agg)
    return pg_loss, None, masked_mean(rollout_log_prob - log_prob.detach(), mask), None, metrics
