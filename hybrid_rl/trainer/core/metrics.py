"""Per-step metrics computed on the driver from the step's batch and timings.

Names follow veRL (``critic/score/mean``, ``response_length/clip_ratio``, ``perf/throughput``,
``timing_s/<step>``, ...) and, for the same facts, AReaL (``task_reward``, ``importance_weight``,
``actor_clip_ratio``, ``no_eos_ratio``, ``avg_seq_len``) so dashboards of either work unchanged.
All functions are pure: DataProto / dicts in, ``dict[str, float]`` out.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from hybrid_rl.protocol import DataProto


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Average list-valued metrics (one entry per worker / micro-batch) into floats."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            vals = [float(v) for v in value]
            if vals:
                out[key] = float(np.mean(vals))
        elif isinstance(value, torch.Tensor):
            out[key] = float(value.float().mean())
        else:
            out[key] = float(value)
    return out


def _masked_stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(mean, max, min) of ``values`` where ``mask`` is set; zeros if the mask is empty."""
    picked = values[mask.bool()]
    if picked.numel() == 0:
        return 0.0, 0.0, 0.0
    return float(picked.mean()), float(picked.max()), float(picked.min())


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and response lengths in tokens, each ``[B]`` float."""
    response_len = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]  # [B, P + R]
    prompt_length = attention_mask[:, :-response_len].sum(-1).float()
    response_length = batch.batch["response_mask"].sum(-1).float()
    return prompt_length, response_length


def compute_data_metrics(
    batch: DataProto,
    use_critic: bool,
    max_response_length: int | None = None,
    max_prompt_length: int | None = None,
) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    Args:
        batch: the step's batch after ``compute_advantage`` (keys per ``hybrid_rl/schema.py``).
        use_critic: also report ``critic/values/*`` and ``critic/vf_explained_var``.
        max_response_length / max_prompt_length: limits for the clip ratios; default = the
            padded widths of ``responses`` / the prompt part.
    """
    tensors = batch.batch
    response_mask = tensors["response_mask"].bool()  # [B, R]
    prompt_length, response_length = _lengths(batch)
    max_resp = max_response_length or tensors["responses"].shape[-1]
    max_prompt = max_prompt_length or (tensors["attention_mask"].shape[-1] - tensors["responses"].shape[-1])

    metrics = {}
    metrics.update(_stats("critic/score", tensors["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)))
    for name in ("advantages", "returns"):
        if name in tensors.keys():
            mean, vmax, vmin = _masked_stats(tensors[name], response_mask)
            metrics.update({f"critic/{name}/mean": mean, f"critic/{name}/max": vmax, f"critic/{name}/min": vmin})
    if use_critic and "values" in tensors.keys():
        mean, vmax, vmin = _masked_stats(tensors["values"], response_mask)
        metrics.update({"critic/values/mean": mean, "critic/values/max": vmax, "critic/values/min": vmin})
        metrics["critic/vf_explained_var"] = explained_variance(tensors["returns"], tensors["values"], response_mask)

    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length >= max_resp).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = float((prompt_length >= max_prompt).float().mean())
    return metrics


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over valid tokens (1 = perfect critic)."""
    mask = mask.bool()
    ret, val = returns[mask].float(), values[mask].float()
    if ret.numel() < 2:
        return 0.0
    var_ret = ret.var(unbiased=False)
    if float(var_ret) == 0.0:
        return 0.0
    return float(1.0 - (ret - val).var(unbiased=False) / var_ret)


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<step>`` for every timed step, plus ``timing_per_token_ms/<step>``.

    Per-token time divides generation by response tokens and every model pass over the whole
    sequence (log-probs, values, updates) by prompt + response tokens.
    """
    prompt_length, response_length = _lengths(batch)
    num_response_tokens = float(response_length.sum())
    num_overall_tokens = num_response_tokens + float(prompt_length.sum())
    tokens_per_step = {"generate": num_response_tokens}
    for name in ("compute_old_log_prob", "compute_ref_log_prob", "compute_values", "update_critic", "update_actor"):
        tokens_per_step[name] = num_overall_tokens
    metrics = {f"timing_s/{name}": float(sec) for name, sec in timing_raw.items()}
    for name, num_tokens in tokens_per_step.items():
        if name in timing_raw and num_tokens > 0:
            metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000.0 / num_tokens
    return metrics


def compute_throughput_metrics(
    batch: DataProto, timing_raw: Mapping[str, float], num_workers: int
) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput`` (tokens/s/worker)."""
    total_tokens = float(batch.batch["attention_mask"].sum())
    step_time = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * num_workers) if step_time > 0 else 0.0,
    }


def compute_actor_mfu(
    num_params: int,
    num_tokens: float,
    ppo_epochs: int,
    update_seconds: float,
    peak_flops_per_worker: float,
    num_workers: int,
    head_params: int = 0,
    head_tokens: float = 0.0,
) -> float:
    """Model-FLOPs utilisation of the actor update: 6 FLOPs (forward + backward) per parameter and
    token, per epoch. ``head_params`` of the ``num_params`` (the LM head) count only for the
    ``head_tokens`` positions they run on (the response-predicting ones); the rest for all
    ``num_tokens``. With ``head_params=0`` this is the usual ``6 N T``.

    The attention score term (~12 L d T^2) is left out: for the short sequences of RL on small
    models it is a few percent, and the estimate stays comparable with veRL's.
    """
    if update_seconds <= 0 or peak_flops_per_worker <= 0:
        return 0.0
    flops = 6.0 * ((num_params - head_params) * num_tokens + head_params * head_tokens)
    achieved = flops * ppo_epochs / update_seconds
    return achieved / (peak_flops_per_worker * num_workers)


def no_eos_ratio(batch: DataProto, eos_token_id: int | list[int]) -> float:
    """Fraction of responses whose last valid token is not an EOS (cut off by the length limit)."""
    responses = batch.batch["responses"]  # [B, R]
    lengths = batch.batch["response_mask"].sum(-1).long()  # [B]
    eos_ids = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # [B]
    ended = torch.isin(last, eos_ids) & (lengths > 0)
    return float((~ended).float().mean())


def behaviour_importance_weight(batch: DataProto) -> float | None:
    """Mean over valid tokens of pi_actor / pi_rollout = exp(old_log_probs - rollout_log_probs).

    1.0 means the rollout engine samples exactly from the actor; None when the rollout did not
    return its log-probs.
    """
    keys = batch.batch.keys()
    if "rollout_log_probs" not in keys or "old_log_probs" not in keys:
        return None
    mask = batch.batch["response_mask"].bool()
    ratio = torch.exp(batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])
    return float(ratio[mask].mean()) if mask.any() else None


def areal_aliases(metrics: Mapping[str, float], batch: DataProto, eos_token_id: int | list[int]) -> dict[str, float]:
    """AReaL's names for facts already measured: task_reward, importance_weight, actor_clip_ratio,
    no_eos_ratio, avg_seq_len."""
    prompt_length, response_length = _lengths(batch)
    out = {
        "task_reward": metrics["critic/score/mean"],
        "no_eos_ratio": no_eos_ratio(batch, eos_token_id),
        "avg_seq_len": float((prompt_length + response_length).mean()),
    }
    if "actor/pg_clipfrac" in metrics:
        out["actor_clip_ratio"] = metrics["actor/pg_clipfrac"]
    weight = behaviour_importance_weight(batch)
    if weight is not None:
        out["importance_weight"] = weight
    return out
