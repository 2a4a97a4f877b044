"""SFT's step and its batch keys (:mod:`hybrid_rl.trainer.core.batch_contract`): one supervised
update of the actor on a batch of tokenised conversations."""

from __future__ import annotations

from hybrid_rl.trainer.core.batch_contract import BatchPlan, StepContract

__all__ = ["SFT_BATCH", "sft_batch_plan"]

SFT_BATCH = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
"""What the SFT dataset's collate gives (``hybrid_rl.data.sft.sft_batch``): each conversation split
before its first target token; ``response_mask`` is the loss mask of the response part."""


def sft_batch_plan() -> BatchPlan:
    """``update_actor`` reads the model inputs and the loss mask; it writes nothing."""
    update = StepContract("update_actor", ("responses", "input_ids", "attention_mask", "position_ids",
                                           "response_mask"))
    return BatchPlan(StepContract("SFT dataset collate", writes=SFT_BATCH), (update,),
                     "hybrid_rl/trainer/sft/contracts.py")
