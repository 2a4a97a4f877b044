"""A learned reward model in RL (``reward_model.enable=true``): the remote service's client, and how its
scores combine with the rule scorer's (the section's checks: :mod:`hybrid_rl.trainer.config.reward_model`;
the worker's config: :func:`hybrid_rl.trainer.ppo.workers.rm_worker_config`).

The reward model runs either in the colocated worker group (a
:class:`~hybrid_rl.workers.rm_worker.RewardModelWorker` per device, role ``rm``: batched,
micro-batched, no grad, ``fsdp_config.param_offload`` on GPU) or, when ``reward_model.model.path`` is
an ``http(s)://`` URL, as a remote service called from the driver
(:class:`~hybrid_rl.reward.remote.RemoteRewardModel`). Either way each response gets one score at
its last token, and::

    token_level_scores = rm_weight x rm_score + rule_weight x rule_score

where ``rm_score`` is normalised with the ``mean`` / ``std`` the reward model was trained with when
``reward_model.normalize`` allows it. The rule score is computed whenever the data has a rule
scorer, so ``critic/rm_score/mean`` and ``critic/rule_score/mean`` sit side by side in the metrics
and reward hacking (the first rising while the second does not) is visible.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.reward_model import is_remote

__all__ = ["build_remote_reward_model", "combine_scores", "pop_rm_scores", "remote_scores", "rewards_with_rm",
           "rule_scores_wanted", "score_metrics"]

def build_remote_reward_model(cfg: PPOConfig):
    """The remote reward service of ``reward_model.model.path=http(s)://...`` (None otherwise)."""
    rm = cfg.reward_model
    if not (rm.enable and is_remote(rm.model.path)):
        return None
    from hybrid_rl.reward.remote import RemoteRewardModel

    return RemoteRewardModel(rm.model.path, timeout_s=rm.timeout, batch_size=rm.micro_batch_size_per_gpu,
                             concurrency=rm.num_workers)


def combine_scores(rm_scores: torch.Tensor, rule_scores: Optional[torch.Tensor], rm_weight: float,
                   rule_weight: float) -> torch.Tensor:
    """``rm_weight x rm_scores + rule_weight x rule_scores``, both token-level ``[B, R]`` (a missing
    rule score counts 0; it is only missing when ``rule_weight`` is 0)."""
    out = rm_weight * rm_scores
    if rule_scores is not None and rule_weight:
        out = out + rule_weight * rule_scores
    return out


def pop_rm_scores(batch: Any) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Remove and return ``(rm_scores [B, R], rm_raw_scores [B])`` from a batch (None when absent),
    so the reward manager scores the rows by rule rather than returning the reward model's scores."""
    keys = batch.batch.keys()
    return tuple(batch.batch.pop(k) if k in keys else None for k in ("rm_scores", "rm_raw_scores"))


def rewards_with_rm(rm_cfg: Any, rm_scores: torch.Tensor, rule_scores: Optional[torch.Tensor],
                    raw_rm_scores: Optional[torch.Tensor], metrics: dict[str, Any]) -> torch.Tensor:
    """The combined token-level reward; adds the side-by-side metrics (and counts a step where the
    remote reward model failed on every row as a failed reward step for the health check)."""
    metrics.update(score_metrics(rm_scores, rule_scores, raw_rm_scores))
    if metrics.get("reward/rm_all_failed", 0.0) > 0:
        metrics["reward/all_failed"] = 1.0
    return combine_scores(rm_scores, rule_scores, rm_cfg.rm_weight, rm_cfg.rule_weight)


def score_metrics(rm_scores: torch.Tensor, rule_scores: Optional[torch.Tensor],
                  raw_rm_scores: Optional[torch.Tensor] = None) -> dict[str, Any]:
    """``critic/rm_score/{mean,max,min}`` (normalised), ``critic/rm_score_raw/mean`` and
    ``critic/rule_score/mean`` from token-level ``[B, R]`` scores (sequence sums)."""
    rm = rm_scores.sum(-1).float()
    metrics = {"critic/rm_score/mean": float(rm.mean()), "critic/rm_score/max": float(rm.max()),
               "critic/rm_score/min": float(rm.min())}
    if raw_rm_scores is not None:
        metrics["critic/rm_score_raw/mean"] = float(raw_rm_scores.float().mean())
    if rule_scores is not None:
        rule = rule_scores.sum(-1).float()
        metrics["critic/rule_score/mean"] = float(rule.mean())
        if rule.std() > 0 and rm.std() > 0:
            metrics["critic/rm_rule_corr"] = float(torch.corrcoef(torch.stack([rm, rule]))[0, 1])
    return metrics


def rule_scores_wanted(cfg: PPOConfig, reward_fn: Any, batch: Any) -> bool:
    """Whether the rule / function scorer runs beside the reward model: always when it is weighted,
    else when it can score every data source of the batch (a custom function always can)."""
    if cfg.reward_model.rule_weight:
        return True
    if not getattr(reward_fn, "uses_default_scorer", False):
        return True
    from hybrid_rl.reward.registry import check_data_sources

    sources = batch.non_tensor_batch.get(cfg.data.reward_fn_key)
    if sources is None or "reward_model" not in batch.non_tensor_batch:
        return False
    try:
        check_data_sources(list(sources))
    except ValueError:
        return False
    return True


def remote_scores(remote: Any, batch: Any, tokenizer: Any) -> Any:
    """Score a rollout batch with a :class:`~hybrid_rl.reward.remote.RemoteRewardModel`: the same
    ``rm_scores`` [B, R] / ``rm_raw_scores`` [B] a reward-model worker returns, metrics in meta_info."""
    from hybrid_rl.protocol import DataProto

    responses, prompts = batch.batch["responses"], batch.batch["prompts"]
    mask = batch.batch["attention_mask"]
    lengths = mask[:, -responses.shape[1]:].sum(-1)  # [B]
    prompt_texts = [tokenizer.decode(prompts[i][mask[i, :prompts.shape[1]].bool()].tolist(), skip_special_tokens=False)
                    for i in range(len(batch))]
    response_texts = tokenizer.batch_decode([responses[i, :n].tolist() for i, n in enumerate(lengths.tolist())],
                                            skip_special_tokens=True)
    info = batch.non_tensor_batch.get("reward_model")
    labels = [r.get("ground_truth") if isinstance(r, dict) else None for r in info] if info is not None else []
    raw_prompts = batch.non_tensor_batch.get("raw_prompt")
    messages = ([[dict(m) for m in raw_prompts[i]] + [{"role": "assistant", "content": response_texts[i]}]
                 for i in range(len(batch))] if raw_prompts is not None else [])
    rewards, metrics = remote.score(prompt_texts, response_texts, labels, messages)
    raw = torch.tensor(rewards, dtype=torch.float32)  # [B]
    token_level = torch.zeros(responses.shape, dtype=torch.float32)
    token_level[torch.arange(len(batch)), (lengths - 1).clamp(min=0)] = raw
    return DataProto.from_dict({"rm_scores": token_level, "rm_raw_scores": raw}, meta_info={"metrics": metrics})
