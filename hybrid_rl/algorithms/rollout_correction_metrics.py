"""The ``rollout_corr/*`` metrics, computed as veRL 0.9.1's ``rollout_corr_helper`` computes them.

Every formula here is veRL 0.9.1's (``compute_is_metrics``, ``compute_rs_metrics``,
``compute_rollout_rejection_mask``'s masked fractions, ``compute_offpolicy_metrics``), under its names,
so a dashboard reads the same numbers from either library:

* the importance-weight metrics summarise the **applied** weights (after truncation or masking, before
  batch normalisation), except ``rollout_is_ratio_fraction_high/low``, ``rollout_is_seq_fraction_high/low``
  and ``rollout_is_oob_ratio``, which count the raw weights outside the bounds; at sequence level
  ``rollout_is_max/min`` and the ratio fractions come from each row's (unclamped) summed log-ratio;
* a rejection criterion's ``_mean`` is token-weighted (a sequence statistic counts once per token),
  its ``_max/_min/_fraction_high/_fraction_low`` count sequences at sequence level, tokens at token level;
* per-sequence summaries (``*_seq_*``, the perplexities, ``chi2_seq``) run over every row of the batch,
  an empty row included (its masked mean is 0), exactly as veRL; the ``rollout_rs_*`` sequence
  statistics over the rows that have tokens, as veRL.

Metrics stay tensors on their device until :func:`host` copies them all at once (one device sync per
call, not one per metric).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

__all__ = ["host", "is_metrics", "masked_max", "mmean", "msum", "offpolicy_metrics", "rs_metrics"]

SAFETY_BOUND = 20.0
"""Bound on a (token or summed) log-ratio before ``exp``, as veRL."""


def msum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """veRL's ``masked_sum``: values off the mask (NaN or inf in padding included) count as 0."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values)) * mask
    return valid.sum() if axis is None else valid.sum(dim=axis)


def mmean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """veRL's ``masked_mean``: ``masked_sum / (mask.sum + 1e-8)`` (an empty row gives 0)."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return msum(values, mask, axis) / (count + 1e-8)


def masked_max(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Largest ``values`` where ``mask`` is set (``axis=-1``: per row, 0 for a row without tokens)."""
    filled = values.masked_fill(~mask.bool(), -math.inf)
    out = filled.max() if axis is None else filled.max(dim=axis).values
    return torch.where(torch.isinf(out) & (out < 0), torch.zeros_like(out), out)


def _token_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), -math.inf).max()


def _token_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), math.inf).min()


def host(metrics: dict[str, Any]) -> dict[str, float]:
    """``metrics`` as floats, with one device-to-host copy for all the tensors among them."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    copied = dict(zip(names, torch.stack([metrics[k].detach().double() for k in names]).tolist() if names else []))
    return {k: copied[k] if k in copied else float(v) for k, v in metrics.items()}


def _masked_std(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sqrt(max(E[x^2] - E[x]^2, 0))`` over the mask, 0 unless it holds more than one token (veRL)."""
    var = mmean(values.square(), mask) - mmean(values, mask).square()
    return torch.where(mask.sum() > 1, var.clamp(min=0.0).sqrt(), torch.zeros_like(var))


def _std(values: torch.Tensor) -> Any:
    """torch's (unbiased) std of a 1-D tensor, 0.0 for fewer than two values (veRL)."""
    return values.std() if values.numel() > 1 else 0.0


def is_metrics(applied: torch.Tensor, raw: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
               level: str, upper: float, lower: Optional[float]) -> dict[str, Any]:
    """veRL 0.9.1's ``compute_is_metrics``.

    Args:
        applied: ``[B, R]`` the weights after truncation or masking (0 off the mask).
        raw: ``[B, R]`` the weights before (exp of the clamped log-ratio, 0 off the mask).
        log_ratio: ``[B, R]`` per-token log-ratios (``token``) or ``[B, 1]`` each row's unclamped sum
            (``sequence``).
        mask: ``[B, R]`` float response mask.
        level: ``token`` or ``sequence``.
        upper, lower: the threshold's bounds (``lower`` None for truncation: 1 / upper then).
    """
    low = 1.0 / upper if lower is None else lower
    log_up = torch.log(torch.tensor(upper, device=applied.device))
    log_low = torch.log(torch.tensor(low, device=applied.device))
    out: dict[str, Any] = {"rollout_is_mean": mmean(applied, mask)}
    if level == "sequence":
        out.update(rollout_is_max=torch.exp(log_ratio.max().clamp(max=SAFETY_BOUND)),
                   rollout_is_min=torch.exp(log_ratio.min()),
                   rollout_is_ratio_fraction_high=(log_ratio > log_up).float().mean(),
                   rollout_is_ratio_fraction_low=(log_ratio < log_low).float().mean())
    else:
        out.update(rollout_is_ratio_fraction_high=mmean((raw > upper).float(), mask),
                   rollout_is_ratio_fraction_low=mmean((raw < low).float(), mask),
                   rollout_is_max=_token_max(applied, mask), rollout_is_min=_token_min(applied, mask))
    bounded = applied.clamp(min=0.0, max=upper)
    out["rollout_is_std"] = _masked_std(bounded, mask)
    normalised = bounded / (mmean(bounded, mask) + 1e-8)
    second = mmean(normalised.square(), mask)  # 0 only when every weight is masked (veRL divides by 0 there)
    out["rollout_is_eff_sample_size"] = torch.where(second > 0, 1.0 / second, torch.zeros_like(second))
    seq = mmean(applied, mask, axis=-1)  # [B], every row (an empty one is 0)
    raw_seq = mmean(raw, mask, axis=-1)
    out.update(rollout_is_seq_mean=seq.mean(), rollout_is_seq_std=_std(seq), rollout_is_seq_max=seq.max(),
               rollout_is_seq_min=seq.min(), rollout_is_seq_max_deviation=(seq - 1.0).abs().max(),
               rollout_is_seq_fraction_high=(raw_seq > upper).float().mean(),
               rollout_is_seq_fraction_low=(raw_seq < low).float().mean())
    return out


def rs_metrics(option: str, stat: torch.Tensor, mask: torch.Tensor, per_sequence: Optional[torch.Tensor],
               upper: float, lower: Optional[float]) -> dict[str, Any]:
    """veRL 0.9.1's ``compute_rs_metrics`` for one criterion.

    Args:
        option: the criterion (``seq_mean_k3``, ...): its metrics are ``rollout_rs_<option>_*``.
        stat: ``[B, R]`` the statistic per token (a sequence's broadcast over its row at sequence level).
        mask: ``[B, R]`` float response mask.
        per_sequence: ``[B]`` the sequence statistic, None at token level.
        upper: the upper bound in the statistic's units (``log(upper)`` for k1).
        lower: the lower bound (``log(lower)`` for k1), None for k2/k3 (no lower bound).
    """
    prefix = f"rollout_rs_{option}"
    rows = mask.sum(dim=-1) > 0
    seq = (per_sequence if per_sequence is not None else mmean(stat, mask, axis=-1))[rows]
    sequence_level = per_sequence is not None and seq.numel() > 0
    out: dict[str, Any] = {f"{prefix}_mean": mmean(stat, mask)}
    if sequence_level:
        out.update({f"{prefix}_max": seq.max(), f"{prefix}_min": seq.min(),
                    f"{prefix}_fraction_high": (seq > upper).float().mean(),
                    f"{prefix}_fraction_low": (seq < lower).float().mean() if lower is not None else 0.0})
    else:
        out.update({f"{prefix}_max": _token_max(stat, mask), f"{prefix}_min": _token_min(stat, mask),
                    f"{prefix}_fraction_high": mmean((stat > upper).float(), mask),
                    f"{prefix}_fraction_low": mmean((stat < lower).float(), mask) if lower is not None else 0.0})
    out[f"{prefix}_std"] = _masked_std(stat.clamp(min=lower if lower is not None else 0.0, max=upper), mask)
    if seq.numel() == 0:
        names = ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low")
        return {**out, **{f"{prefix}_seq_{n}": 0.0 for n in names}}
    out.update({f"{prefix}_seq_mean": seq.mean(), f"{prefix}_seq_std": _std(seq), f"{prefix}_seq_max": seq.max(),
                f"{prefix}_seq_min": seq.min(), f"{prefix}_seq_max_deviation": seq.abs().max(),
                f"{prefix}_seq_fraction_high": (seq > upper).float().mean()})
    if lower is not None:
        out[f"{prefix}_seq_fraction_low"] = (seq < lower).float().mean()
    return out


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """veRL 0.9.1's ``compute_offpolicy_metrics``: how far pi_rollout is from pi_train on the sampled
    tokens (perplexities and their gap per sequence, averaged over every row; KL, k3 KL and chi^2)."""
    old = old_log_prob.detach().to(torch.promote_types(old_log_prob.dtype, torch.float32))
    ro = rollout_log_prob.detach().to(old.dtype)
    mask = response_mask.to(old.dtype)
    mean_train, mean_ro = mmean(old, mask, axis=-1), mmean(ro, mask, axis=-1)  # [B]
    log_ratio = old - ro
    diff = mean_ro - mean_train
    seq_log = msum(log_ratio, mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return host({"training_ppl": torch.exp(-mean_train).mean(), "training_log_ppl": (-mean_train).mean(),
                 "kl": mmean(ro - old, mask), "k3_kl": mmean(torch.exp(log_ratio) - log_ratio - 1, mask),
                 "rollout_ppl": torch.exp(-mean_ro).mean(), "rollout_log_ppl": (-mean_ro).mean(),
                 "log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(),
                 "log_ppl_diff_max": diff.max(), "log_ppl_diff_min": diff.min(),
                 "ppl_ratio": torch.exp(diff).mean(),
                 "chi2_token": mmean(torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask) - 1.0,
                 "chi2_seq": torch.exp(2.0 * seq_log).mean() - 1.0})
