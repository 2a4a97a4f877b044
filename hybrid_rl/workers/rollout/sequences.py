"""Turning engine outputs (variable-length token lists) into the rollout batch; used by both engines.

Shapes: B rows, P prompt length (left-padded), R = ``response_length`` (right-padded), L = P + R.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.params import GenerationParams

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def check_prompt_batch(prompts: DataProto, prompt_length: int) -> None:
    """Raise a ValueError unless the batch carries [B, P] prompt tensors with P <= prompt_length."""
    missing = [k for k in PROMPT_KEYS if prompts.batch is None or k not in prompts.batch.keys()]
    if missing:
        raise ValueError(f"generate_sequences: the prompt batch lacks {missing}. Fix: pass the dataset's "
                         "collated batch (input_ids, attention_mask, position_ids, left-padded).")
    shapes = {k: tuple(prompts.batch[k].shape) for k in PROMPT_KEYS}
    if len(set(shapes.values())) != 1 or len(shapes["input_ids"]) != 2:
        raise ValueError(f"generate_sequences: prompt tensors must all be [B, P], got {shapes}. Fix: use "
                         "1-D position ids per row (multimodal 3-D position ids are not supported).")
    width = shapes["input_ids"][1]
    if width > prompt_length:
        raise ValueError(f"generate_sequences: prompts are {width} tokens wide but rollout.prompt_length="
                         f"{prompt_length}. Fix: set rollout.prompt_length >= data.max_prompt_length.")


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The valid (unpadded) prompt tokens of each row. input_ids, attention_mask: [B, P]."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


def eos_cut_length(tokens: Sequence[int], eos_token_ids: Sequence[int]) -> int:
    """Number of tokens to keep: up to and including the first EOS, else all of them."""
    eos = set(eos_token_ids)
    for i, tok in enumerate(tokens):
        if tok in eos:
            return i + 1
    return len(tokens)


def build_rollout_output(prompts: DataProto, responses: list[Sequence[int]], params: GenerationParams,
                         log_probs: Optional[list[Sequence[float]]] = None) -> DataProto:
    """Assemble the rollout batch from the prompt batch and one generated token list per row.

    Each response is cut after its first EOS and after ``response_length`` tokens, then
    right-padded with ``pad_token_id``. Returns ``prompts`` [B, P], ``responses`` [B, R],
    ``response_mask`` [B, R] (1 on generated tokens up to and including EOS), ``input_ids``,
    ``attention_mask`` and ``position_ids`` [B, L] (positions continue after each prompt's last
    position, also over padding) and ``rollout_log_probs`` [B, R] float32 (0 on padding) when
    ``log_probs`` is given. ``non_tensor_batch`` and ``meta_info`` are passed through.
    """
    prompt_ids = prompts.batch["input_ids"]  # [B, P]
    prompt_mask = prompts.batch["attention_mask"]  # [B, P]
    prompt_pos = prompts.batch["position_ids"]  # [B, P]
    num_rows, resp_len = prompt_ids.shape[0], params.response_length
    assert len(responses) == num_rows, f"{len(responses)} responses for {num_rows} prompt rows"
    response_ids = torch.full((num_rows, resp_len), params.pad_token_id, dtype=prompt_ids.dtype)
    response_mask = torch.zeros((num_rows, resp_len), dtype=prompt_mask.dtype)
    rollout_log_probs = torch.zeros((num_rows, resp_len), dtype=torch.float32)
    for i, tokens in enumerate(responses):
        keep = eos_cut_length(list(tokens)[:resp_len], params.eos_token_ids)
        response_ids[i, :keep] = torch.as_tensor(list(tokens)[:keep], dtype=prompt_ids.dtype)
        response_mask[i, :keep] = 1
        if log_probs is not None:
            rollout_log_probs[i, :keep] = torch.as_tensor(list(log_probs[i])[:keep], dtype=torch.float32)
    delta = torch.arange(1, resp_len + 1, dtype=prompt_pos.dtype)  # [R]
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),  # [B, L]
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),  # [B, L]
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),  # [B, L]
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = rollout_log_probs
    return DataProto.from_dict(tensors, non_tensors=dict(prompts.non_tensor_batch),
                               meta_info=dict(prompts.meta_info))
