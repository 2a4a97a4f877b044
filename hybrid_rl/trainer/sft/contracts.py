"""SFT's step and its batch keys (:mod:`hybrid_rl.trainer.core.batch_contract`): one supervised
update of the actor, by the ``nll`` objective, on a batch of tokenised conversations."""

from __future__ import annotations

from hybrid_rl.objectives import build_objective
from hybrid_rl.trainer.config.supervised import SFT_OBJECTIVE
from hybrid_rl.trainer.core.batch_contract import BatchPlan, StepContract

__all__ = ["MODEL_INPUTS", "SFT_BATCH", "sft_batch_plan"]

SFT_BATCH = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
"""What the SFT dataset's collate gives (``hybrid_rl.data.sft.sft_batch``): each conversation split
before its first target token; ``response_mask`` is the loss mask of the response part."""
MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")
"""What the actor's forward reads."""


def sft_batch_plan() -> BatchPlan:
    """``update_actor`` reads the model inputs and what the ``nll`` objective declares (the loss
    mask); it writes nothing."""
    objective = build_objective(SFT_OBJECTIVE)
    reads = MODEL_INPUTS + tuple(k for k in objective.required_keys() if k not in MODEL_INPUTS)
    update = StepContract("update_actor", reads, tuple(objective.optional_reads))
    return BatchPlan(StepContract("SFT dataset collate", writes=SFT_BATCH), (update,),
                     "hybrid_rl/trainer/sft/contracts.py")
