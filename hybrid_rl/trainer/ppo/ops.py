"""Driver-side batch operations of one PPO step (light math on DataProto, no model calls).

``prepare_rollout_batch`` repeats each prompt ``n`` times (interleaved: a,a,b,b) with a ``uid``
shared by the copies, so group estimators (GRPO, RLOO) see each prompt's responses as a group.
``apply_kl_penalty`` and ``compute_advantage`` wrap the pure functions of
:mod:`hybrid_rl.algorithms`, reading and writing the batch keys of :mod:`hybrid_rl.schema`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybrid_rl import algorithms
from hybrid_rl.protocol import DataProto

# Prompt tensors produced by the dataset collate; the rollout returns prompt || response versions.
PROMPT_TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")


def prepare_rollout_batch(batch: DataProto, n: int, step: int | str) -> DataProto:
    """Give every prompt a ``uid`` (``"<step>-<row>"``, deterministic for resumed runs) and repeat
    the batch ``n`` times interleaved: rows ``[p0, p0, ..., p1, p1, ...]`` ([B] -> [B * n])."""
    uids = np.array([f"{step}-{i}" for i in range(len(batch))], dtype=object)
    batch.non_tensor_batch["uid"] = uids
    return batch.repeat(repeat_times=n, interleave=True)


def split_generation_inputs(batch: DataProto) -> tuple[DataProto, DataProto]:
    """(inputs for ``generate_sequences``, the rest of the batch).

    The prompt tensors move to the generation batch (the rollout returns full-sequence versions
    under the same names); the non-tensor columns are shared so the rollout can read e.g.
    ``raw_prompt``.
    """
    tensor_keys = [k for k in PROMPT_TENSOR_KEYS if k in batch.batch.keys()]
    gen = batch.pop(batch_keys=tensor_keys)
    gen.non_tensor_batch = dict(batch.non_tensor_batch)
    return gen, batch


def merge_generation_output(batch: DataProto, output: DataProto) -> DataProto:
    """Add the rollout's tensors (prompts, responses, response_mask, full input_ids, ...) to ``batch``
    in place; the rollout's per-worker ``metrics`` stay in ``output.meta_info``."""
    if batch.batch is None:
        batch.batch = output.batch
    else:
        for key in output.batch.keys():
            batch.batch[key] = output.batch[key]
    for key, value in output.non_tensor_batch.items():
        batch.non_tensor_batch.setdefault(key, value)
    batch.meta_info.update({k: v for k, v in output.meta_info.items() if k != "metrics"})
    return batch


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty: str) -> tuple[DataProto, dict[str, float]]:
    """``token_level_rewards = token_level_scores - beta * KL(actor || ref)`` per token.

    KL is estimated on the sampled tokens from ``old_log_probs`` and ``ref_log_prob`` (both
    [B, R]); the controller sees the batch-mean per-sequence KL and updates ``beta``.
    """
    response_mask = data.batch["response_mask"].float()  # [B, R]
    kld = algorithms.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty)
    kld = kld * response_mask  # [B, R]
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = float(algorithms.masked_mean(kld, response_mask, axis=-1).mean())  # mean of per-seq KL
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
) -> DataProto:
    """Fill ``advantages`` and ``returns`` ([B, R]) with the registered estimator ``adv_estimator``."""
    tensors = data.batch
    advantages, returns = algorithms.compute_advantage(
        adv_estimator,
        token_level_rewards=tensors["token_level_rewards"],
        response_mask=tensors["response_mask"],
        values=tensors["values"] if "values" in tensors.keys() else None,
        index=data.non_tensor_batch.get("uid"),
        reward_baselines=tensors["reward_baselines"] if "reward_baselines" in tensors.keys() else None,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    data.batch["advantages"] = advantages.to(torch.float32)
    data.batch["returns"] = returns.to(torch.float32)
    return data
