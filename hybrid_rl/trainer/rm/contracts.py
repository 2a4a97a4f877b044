"""Reward-model training's step and its batch keys (:mod:`hybrid_rl.trainer.core.batch_contract`):
one Bradley-Terry update on a batch of preference pairs."""

from __future__ import annotations

from hybrid_rl.trainer.core.batch_contract import BatchPlan, StepContract

__all__ = ["PAIR_BATCH", "rm_batch_plan"]

PAIR_BATCH = tuple(f"{side}_{key}" for side in ("chosen", "rejected")
                   for key in ("input_ids", "attention_mask", "position_ids")) + ("margin",)
"""What the preference dataset's collate gives (``hybrid_rl.data.reward_data.pair_tensors``)."""


def rm_batch_plan() -> BatchPlan:
    """``update_reward_model`` reads both sides of every pair and the margins; it writes nothing."""
    return BatchPlan(StepContract("preference dataset collate", writes=PAIR_BATCH),
                     (StepContract("update_reward_model", PAIR_BATCH),), "hybrid_rl/trainer/rm/contracts.py")
