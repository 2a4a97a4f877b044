"""Named profiler ranges around the phases of the training passes.

``benchmarks/profile_update.py`` reads them to say where a pass spends its host time and, on a GPU,
which phase the host was in while the GPU sat idle. Outside a profiler a range costs a few
microseconds; the passes open a handful per micro-batch.
"""

from __future__ import annotations

import torch

#: Every range of this package starts with this prefix.
PREFIX = "hybrid_rl/"

#: The phases, in the order a micro-batch meets them.
PHASES = {
    "inputs": "pack the micro-batch on the host and copy it to the device",
    "model": "the model's forward (its attention calls are the nested packed_attention ranges)",
    "packed_attention": "one layer's packed attention call, inside model",
    "log_probs": "log-probs (and entropy) of the response tokens: from the logits, or from the LM head's "
                 "input inside model (the fused head)",
    "loss": "the policy loss and its terms from the log-probs",
    "backward": "autograd's backward of one micro-batch's loss",
    "metrics": "the mini-batch's loss sums and metrics brought to the host",
    "optimizer_step": "gradient clipping, the finiteness check and the optimizer's step",
}


def phase(name: str) -> torch.profiler.record_function:
    """The profiler range of phase ``name`` (a key of :data:`PHASES`, listed in the order a pass
    runs them), used as a context manager."""
    if name not in PHASES:
        raise ValueError(f"unknown profiler phase {name!r}; known: {list(PHASES)}. "
                         "Fix: use one of them, or add the new phase to PHASES with its description.")
    return torch.profiler.record_function(PREFIX + name)
