"""The rollout batch layout from token lists: left-padded prompts, right-padded responses.

Used wherever rows are rebuilt from unpadded ids (the experience buffer, SFT conversations), so they
match what the rollout engines produce: ``prompts [B, P]`` left-padded, ``responses [B, R]``
right-padded, ``input_ids`` / ``attention_mask`` / ``position_ids [B, P+R]`` with the prompt
positions counted as the dataset's collate does and the response positions continuing after the
last prompt token, as the rollout writes them.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["prompt_response_tensors"]


def prompt_response_tensors(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                            response_masks: Sequence[Sequence[int]], pad_token_id: int,
                            prompt_width: Optional[int] = None,
                            response_width: Optional[int] = None) -> dict[str, torch.Tensor]:
    """``prompts, responses, response_mask, input_ids, attention_mask, position_ids`` for B rows;
    widths default to the longest prompt / response (a given width must fit every row)."""
    rows = len(prompts)
    width = prompt_width if prompt_width is not None else max(len(p) for p in prompts)
    length = response_width if response_width is not None else max(len(r) for r in responses)
    prompt_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)  # [B, P]
    prompt_mask = torch.zeros((rows, width), dtype=torch.long)
    response_ids = torch.full((rows, length), pad_token_id, dtype=torch.long)  # [B, R]
    valid = torch.zeros((rows, length), dtype=torch.long)
    response_mask = torch.zeros((rows, length), dtype=torch.long)
    for i, (prompt, response, mask) in enumerate(zip(prompts, responses, response_masks)):
        p, n = len(prompt), len(response)
        prompt_ids[i, width - p:] = torch.as_tensor(list(prompt), dtype=torch.long)
        prompt_mask[i, width - p:] = 1
        response_ids[i, :n] = torch.as_tensor(list(response), dtype=torch.long)
        valid[i, :n] = 1
        response_mask[i, :n] = torch.as_tensor(list(mask), dtype=torch.long)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P], as the dataset's collate
    response_pos = prompt_pos[:, -1:] + torch.arange(1, length + 1)  # [B, R], as the rollout
    return {"prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": torch.cat([prompt_mask, valid], dim=1),
            "position_ids": torch.cat([prompt_pos, response_pos], dim=1)}
