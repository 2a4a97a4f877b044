"""DPO's held-out pair metrics: the objective's loss and TRL's reward statistics of the current
policy against the reference on the held-out pairs (``val/dpo/loss``, ``val/dpo/rewards/accuracies``,
``val/dpo/rewards/margins``, ...), each a mean over every held-out pair."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from hybrid_rl.objectives import MicroBatch
from hybrid_rl.protocol import DataProto

__all__ = ["held_out_pair_metrics"]

LogProbs = Callable[[DataProto], torch.Tensor]
"""A batch's ``[2B, R]`` log-probs of its responses (the policy's or the reference's)."""


def held_out_pair_metrics(objective: Any, batches: Iterable[DataProto], policy: LogProbs,
                          reference: Optional[LogProbs]) -> dict[str, float]:
    """``val/<objective metric>``: each batch's metrics (means over its pairs) weighted by its pair
    count. ``reference`` None: the objective reads no reference (``simpo``, ``reference_free``)."""
    totals: dict[str, float] = {}
    pairs = 0
    for batch in batches:
        mask = batch.batch["response_mask"]
        inputs = {"response_mask": mask}
        if reference is not None:
            inputs["ref_log_prob"] = reference(batch)
        with torch.no_grad():
            _, metrics = objective(MicroBatch(batch=inputs, log_prob=policy(batch), agg={}))
        count = mask.shape[0] // 2
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + float(value) * count
        pairs += count
    return {f"val/{name}": total / max(pairs, 1) for name, total in totals.items()}
