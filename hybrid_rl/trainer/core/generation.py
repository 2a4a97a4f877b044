"""The plumbing of a generate call, shared by the training rollout and held-out validation.

``prepare_rollout_batch`` repeats each prompt ``n`` times (interleaved: a,a,b,b) with a ``uid``
shared by the copies, so group estimators (GRPO, RLOO) see each prompt's responses as a group;
``split_generation_inputs`` / ``merge_generation_output`` move the prompt tensors to the engine and
its outputs back; ``generation_meta`` is the call's ``meta_info``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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


def generation_meta(tokenizer, seed: int, step: int, validate: bool) -> dict[str, Any]:
    """The ``meta_info`` of a generate call: end and pad tokens, whether it validates, and the engine's
    sampling seed (``trainer.seed``, + the step for a training batch so each step samples anew)."""
    return {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "validate": validate, "seed": seed + (0 if validate else step), "global_steps": step}
