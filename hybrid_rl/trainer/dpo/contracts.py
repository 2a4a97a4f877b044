"""DPO's steps and their batch keys (:mod:`hybrid_rl.trainer.core.batch_contract`): the frozen
reference's log-probs of both responses of every pair (when the loss reads them), then one update
of the actor by the ``dpo`` objective."""

from __future__ import annotations

from typing import Any

from hybrid_rl.trainer.core.batch_contract import BatchPlan, StepContract

__all__ = ["DPO_BATCH", "MODEL_INPUTS", "dpo_batch_plan"]

DPO_BATCH = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "data_source")
"""What the DPO dataset's collate gives (``hybrid_rl.data.dpo_data.DPODataset``): 2B rows for B pairs,
row 2i a pair's chosen and row 2i+1 its rejected response."""
MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")
"""What a policy forward (actor or reference) reads."""


def dpo_batch_plan(objective: Any, with_reference: bool) -> BatchPlan:
    """``[compute_ref_log_prob] -> update_actor``: the reference pass writes ``ref_log_prob`` (only
    with ``with_reference``); the update reads the model inputs and what ``objective`` declares."""
    steps = [StepContract("compute_ref_log_prob", MODEL_INPUTS, (), ("ref_log_prob",))] if with_reference else []
    reads = MODEL_INPUTS + tuple(k for k in objective.required_keys() if k not in MODEL_INPUTS)
    steps.append(StepContract("update_actor", reads, tuple(objective.optional_reads)))
    return BatchPlan(StepContract("DPO dataset collate", writes=DPO_BATCH), tuple(steps),
                     "hybrid_rl/trainer/dpo/contracts.py")
