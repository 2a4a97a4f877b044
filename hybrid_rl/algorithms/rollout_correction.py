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
veRL's names (``rollout_corr/...``). Pure math: no config objects beyond :class:`RolloutCorrectionConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Optional

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.algorithms.masked import masked_mean, masked_sum

__all__ = ["ROLLOUT_CORRECTION_PRESETS", "RS_OPTIONS", "RolloutCorrectionConfig", "SAFETY_BOUND", "RejectionSpec",
           "bypass_policy_loss", "compute_rollout_correction", "offpolicy_metrics", "parse_is_threshold",
           "parse_rejection_specs", "rejection_mask", "rollout_is_weights"]

SAFETY_BOUND = 20.0
"""Bound on a (token or summed) log-ratio before ``exp`` (exp(20) ~ 5e8, finite in fp32), as veRL."""

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
    if isinstance(value, str) and "_" in value:
        lower, upper = _floats(value.split("_", 1), key)
        if not 0 < lower < upper:
            raise ValueError(f"{key}={value!r}: need 0 < lower < upper, e.g. '0.5_2.0'.")
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


def _v(value: torch.Tensor) -> torch.Tensor:
    """A metric kept on its device until :func:`_host` copies them all at once (a float per metric
    would stop a GPU once each, at every micro-batch of bypass mode)."""
    return value.detach()


def _host(metrics: dict[str, Any]) -> dict[str, float]:
    """``metrics`` as floats, with one device-to-host copy for all the tensors among them."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    copied = dict(zip(names, torch.stack([metrics[k].double() for k in names]).tolist() if names else []))
    return {k: copied[k] if k in copied else float(v) for k, v in metrics.items()}


def _has_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(-1) > 0  # [B]


def _masked_max(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Largest ``values`` where ``mask`` is set (``axis=-1``: per row, 0 for a row without tokens)."""
    filled = values.masked_fill(~mask.bool(), -math.inf)
    out = filled.max() if axis is None else filled.max(dim=axis).values
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


def _masked_min(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    return -_masked_max(-values, mask, axis)


def rollout_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       level: str, threshold: Any = 2.0,
                       batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached importance weights ``[B, R]`` (0 off the mask) and their metrics (module docstring).

    Args:
        old_log_prob, rollout_log_prob: ``[B, R]`` log-probs of the sampled tokens under the trainer's
            and the rollout engine's policy.
        response_mask: ``[B, R]`` the tokens that count.
        level: ``token`` or ``sequence``.
        threshold: ``rollout_is_threshold`` (a number: truncate; ``"lower_upper"``: mask outside).
        batch_normalize: divide by the batch mean of the weights (tokens, or sequences).
    """
    lower, upper = parse_is_threshold(threshold)
    raw = _float(old_log_prob) - _float(rollout_log_prob)  # [B, R]
    mask = response_mask.to(raw.dtype)
    if level == "token":
        log_w = raw.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    elif level == "sequence":
        seq_log = masked_sum(raw, mask, axis=-1)  # [B]
        log_w = seq_log.clamp(-SAFETY_BOUND, SAFETY_BOUND).unsqueeze(-1).expand_as(raw)
    else:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r} must be token, sequence or null.")
    weights = torch.exp(log_w) * mask
    metrics = _is_metrics(weights, log_w, mask, level, lower, upper)
    if lower is None:
        weights = weights.clamp(max=upper)
    else:
        inside = (weights >= lower) & (weights <= upper)
        metrics["rollout_is_masked_fraction"] = _v(masked_mean((~inside).float(), mask))
        weights = weights * inside
    if batch_normalize:
        rows = _has_tokens(mask)
        mean = (masked_mean(weights, mask) if level == "token"
                else masked_mean(weights, mask, axis=-1)[rows].mean())
        factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))  # no host round trip
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights.detach(), _host(metrics)


def _is_metrics(weights: torch.Tensor, log_w: torch.Tensor, mask: torch.Tensor, level: str,
                lower: Optional[float], upper: float) -> dict[str, float]:
    """The weights before truncation or masking, veRL's ``rollout_is_*`` names."""
    low = lower if lower is not None else 1.0 / upper
    rows = _has_tokens(mask)
    out = {"rollout_is_mean": _v(masked_mean(weights, mask))}
    if level == "token":
        out.update(rollout_is_max=_v(_masked_max(weights, mask)), rollout_is_min=_v(_masked_min(weights, mask)),
                   rollout_is_ratio_fraction_high=_v(masked_mean((weights > upper).float(), mask)),
                   rollout_is_ratio_fraction_low=_v(masked_mean((weights < low).float(), mask)))
    else:
        seq_log = log_w[:, 0][rows]  # [B'] the sequences' (clamped) log weights
        out.update(rollout_is_max=_v(torch.exp(seq_log.max())), rollout_is_min=_v(torch.exp(seq_log.min())),
                   rollout_is_ratio_fraction_high=_v((seq_log > math.log(upper)).float().mean()),
                   rollout_is_ratio_fraction_low=_v((seq_log < math.log(low)).float().mean()))
    clipped = weights.clamp(low, upper)
    mean = masked_mean(clipped, mask)
    var = masked_mean((clipped - mean) ** 2, mask)
    out["rollout_is_std"] = _v(var.clamp(min=0).sqrt())
    out["rollout_is_eff_sample_size"] = _v(1.0 / masked_mean((clipped / (mean + 1e-8)) ** 2, mask))
    seq = masked_mean(weights, mask, axis=-1)[rows]  # [B']
    out.update(rollout_is_seq_mean=_v(seq.mean()), rollout_is_seq_std=_v(seq.std()) if seq.numel() > 1 else 0.0,
               rollout_is_seq_max=_v(seq.max()), rollout_is_seq_min=_v(seq.min()),
               rollout_is_seq_max_deviation=_v((seq - 1).abs().max()),
               rollout_is_seq_fraction_high=_v((seq > upper).float().mean()),
               rollout_is_seq_fraction_low=_v((seq < low).float().mean()))
    return out


def _divergence(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """``k1 = -r``, ``k2 = r^2 / 2``, ``k3 = exp(r) - 1 - r`` per token (``r = log pi_train/pi_rollout``)."""
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    return torch.exp(log_ratio) - 1.0 - log_ratio


def _statistic(per_token: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The criterion's value per token (``token``) or per sequence broadcast to its tokens, ``[B, R]``."""
    if level == "token":
        return per_token
    if level == "seq_sum":
        seq = masked_sum(per_token, mask, axis=-1)
    elif level == "seq_mean":
        seq = masked_mean(per_token, mask, axis=-1)
    else:
        seq = _masked_max(per_token, mask, axis=-1)
    return seq.unsqueeze(-1).expand_as(per_token)


def rejection_mask(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                   specs: list[RejectionSpec]) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` ``[B, R]`` with every token (or sequence) that fails a criterion of ``specs``
    set to 0, and veRL's ``rollout_rs_*`` metrics."""
    log_ratio = _log_ratio(old_log_prob, rollout_log_prob)
    mask = response_mask.to(log_ratio.dtype)
    keep_all = torch.ones_like(mask)
    rows = _has_tokens(mask)
    metrics: dict[str, float] = {}
    for spec in specs:
        stat = _statistic(_divergence(log_ratio, spec.estimator), mask, spec.level)  # [B, R]
        if spec.lower is not None:
            high, low = stat > math.log(spec.upper), stat < math.log(spec.lower)
        else:
            high, low = stat > spec.upper, torch.zeros_like(stat, dtype=torch.bool)
        keep = (~(high | low)).float()
        keep_all = keep_all * keep
        values = stat[mask.bool()] if spec.level == "token" else stat[:, 0][rows]
        name = f"rollout_rs_{spec.option}"
        metrics.update({f"{name}_mean": _v(values.mean()), f"{name}_max": _v(values.max()),
                        f"{name}_min": _v(values.min()),
                        f"{name}_fraction_high": _v(masked_mean(high.float(), mask)),
                        f"{name}_fraction_low": _v(masked_mean(low.float(), mask)),
                        f"{name}_masked_fraction": _v(masked_mean(1 - keep, mask)),
                        f"{name}_seq_masked_fraction": _v(((1 - keep) * mask).amax(-1)[rows].mean())})
    new_mask = response_mask * keep_all.to(response_mask.dtype)
    metrics["rollout_rs_masked_fraction"] = _v(masked_mean(1 - keep_all, mask))
    metrics["rollout_rs_seq_masked_fraction"] = _v(((1 - keep_all) * mask).amax(-1)[rows].mean())
    return new_mask, _host(metrics)


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """How far pi_rollout is from pi_train on the sampled tokens: perplexities, their gap, KL, chi^2
    (veRL's names; means over the sequences that have tokens)."""
    old, ro = _float(old_log_prob), _float(rollout_log_prob)
    mask = response_mask.to(old.dtype)
    rows = _has_tokens(mask)
    train_log_ppl = -masked_mean(old, mask, axis=-1)[rows]  # [B']
    rollout_log_ppl = -masked_mean(ro, mask, axis=-1)[rows]
    diff = train_log_ppl - rollout_log_ppl  # = mean_t(ro) - mean_t(old)
    r = old - ro
    clamped = r.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_log = masked_sum(clamped, mask, axis=-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return _host({"training_ppl": _v(torch.exp(train_log_ppl).mean()), "training_log_ppl": _v(train_log_ppl.mean()),
                  "rollout_ppl": _v(torch.exp(rollout_log_ppl).mean()), "rollout_log_ppl": _v(rollout_log_ppl.mean()),
                  "kl": _v(masked_mean(ro - old, mask)), "k3_kl": _v(masked_mean(torch.exp(r) - r - 1, mask)),
                  "log_ppl_diff": _v(diff.mean()), "log_ppl_abs_diff": _v(diff.abs().mean()),
                  "log_ppl_diff_max": _v(diff.max()), "log_ppl_diff_min": _v(diff.min()),
                  "ppl_ratio": _v(torch.exp(diff).mean()),
                  "chi2_token": _v(masked_mean(torch.exp(clamped) ** 2, mask) - 1),
                  "chi2_seq": _v(torch.exp(2 * seq_log).mean() - 1)})


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

    Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower, rollout_corr metrics)``."""
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
    zero = pg_loss.new_zeros(())
    return pg_loss, zero, masked_mean(rollout_log_prob - log_prob.detach(), response_mask), zero, metrics
