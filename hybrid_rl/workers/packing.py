"""Packed layouts of a micro-batch: only valid tokens, and (prefix grouper) one copy of each prompt.

A row is ``prompt (left-padded, P columns) || response (right-padded, R columns)``. Packing puts
the valid tokens of all rows into one ``[1, T]`` sequence; each packed *segment* attends causally
to itself and, optionally, fully to an earlier *prefix* segment (its group's prompt).

* Row packing (``use_remove_padding``): one segment per row, no prefix. ``T`` = valid tokens.
* Prefix grouping (``use_prefix_grouper``, GRPO's ``rollout.n`` responses to one prompt): rows
  whose prompts are identical share one copy of the prompt. The layout is
  ``prompt_g, response_g1, ..., response_gn`` per group; the prompt is a segment without prefix
  and each response a segment whose prefix is its group's prompt (one attention call per group,
  with a ``[L_g, L_g]`` mask: :func:`group_mask`). Prompt tokens do not attend to
  responses (causality), so each response sees exactly the keys it sees in its own padded row, the
  prompt's hidden states are computed once instead of ``n`` times, and gradients from all ``n``
  responses flow into the one copy: the loss and its gradient are those of the unshared batch
  (PrefixGrouper, arXiv:2506.05433). ``T`` = distinct prompt tokens + response tokens.

The LM head runs only on the positions that predict a response token (``keep``); a group's last
prompt token predicts the first token of each of its responses, so it appears there ``n`` times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from hybrid_rl.workers.varlen_attention import PackedBlock, PackedLayout, cu_seq_lens


@dataclass
class PackedBatch:
    """One micro-batch packed for a maskless forward."""

    input_ids: torch.Tensor
    """``[1, T]`` token ids."""
    position_ids: torch.Tensor
    """``[1, T]`` positions, taken from the rows (a response continues its prompt's positions)."""
    window: torch.Tensor
    """``[B, R]`` bool: response-predicting columns that hold a valid token."""
    keep: torch.Tensor
    """``[N]`` long, ``N = window.sum()``: the packed index of each window position (row-major)."""
    attention_kwargs: dict
    """Model-call kwargs describing the segments for the varlen attention."""

    @property
    def window_index(self) -> torch.Tensor:
        """``[N]`` long: the flat ``[B * R]`` index of each window position (row-major), to place
        per-token results without a boolean-mask index (which would sync a GPU)."""
        return self.window.reshape(-1).nonzero().squeeze(-1)

    def to(self, device: torch.device | str) -> "PackedBatch":
        """This batch with every tensor on ``device`` (layouts are built on the host, so the
        model's device never waits on host-side bookkeeping)."""
        from hybrid_rl.workers.fsdp_utils import to_device

        moved: dict[int, torch.Tensor] = {}

        def move(tensor: torch.Tensor) -> torch.Tensor:  # one copy per tensor: cu_seq_lens is named thrice
            if id(tensor) not in moved:
                moved[id(tensor)] = to_device(tensor, device)
            return moved[id(tensor)]

        kwargs = {k: move(v) if isinstance(v, torch.Tensor) else v for k, v in self.attention_kwargs.items()}
        layout = kwargs.get("packed_layout")
        if layout is not None:
            if layout.cu_seq_lens is not None:
                layout.cu_seq_lens = move(layout.cu_seq_lens)
            for block in layout.blocks:  # moved once, used by every layer
                block.mask = None if block.mask is None else move(block.mask)
        return PackedBatch(move(self.input_ids), move(self.position_ids), move(self.window), move(self.keep), kwargs)


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  response_length: int) -> list[list[int]]:
    """Rows with identical prompts (same valid tokens), as lists of ascending row indices ordered by
    their first row. ``input_ids``/``attention_mask`` are ``[B, L]`` with the last
    ``response_length`` columns the response."""
    prompt_cols = input_ids.shape[1] - response_length
    key = torch.where(attention_mask[:, :prompt_cols].bool(), input_ids[:, :prompt_cols], -1)  # [B, P]
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(inverse.tolist()):
        groups.setdefault(g, []).append(row)
    return sorted(groups.values(), key=lambda rows: rows[0])


def batch_prompt_groups(batch: dict[str, torch.Tensor], enabled: bool) -> Optional[list[list[int]]]:
    """:func:`prompt_groups` of a micro-batch dict (``input_ids``, ``attention_mask``,
    ``responses``), or None when the prefix grouper is off."""
    if not enabled:
        return None
    return prompt_groups(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])


def has_shared_prompts(groups: Optional[list[list[int]]]) -> bool:
    return groups is not None and any(len(rows) > 1 for rows in groups)


def group_token_counts(attention_mask: torch.Tensor, response_length: int,
                       groups: list[list[int]]) -> list[int]:
    """Tokens each group computes when grouped: its prompt once plus all its responses."""
    prompt_cols = attention_mask.shape[1] - response_length
    prompt_len = attention_mask[:, :prompt_cols].sum(-1).tolist()
    response_len = attention_mask[:, prompt_cols:].sum(-1).tolist()
    return [prompt_len[g[0]] + sum(response_len[i] for i in g) for g in groups]


def first_valid_column(attention_mask: torch.Tensor) -> int:
    """First column that is a valid token in some row (0 for an all-padding mask)."""
    valid_cols = attention_mask.any(dim=0).nonzero()
    return int(valid_cols[0]) if len(valid_cols) else 0


def _row_packed(input_ids, attention_mask, position_ids, response_length) -> PackedBatch:
    """One segment per row (the row boundaries go to the model as ``cu_seq_lens_q``, HF's
    flash-attention kwarg, so GPU flash-attention varlen kernels read the same layout)."""
    mask = attention_mask.bool()
    flat_mask = mask.reshape(-1)
    ids = input_ids.reshape(-1)[flat_mask].unsqueeze(0)  # [1, T]
    pos = position_ids.reshape(-1)[flat_mask].unsqueeze(0)  # [1, T]
    packed_index = torch.cumsum(flat_mask.long(), 0).reshape(mask.shape) - 1  # [B, L]
    length = input_ids.shape[1]
    cols = slice(length - response_length - 1, length - 1)
    window = mask[:, cols]  # [B, R]
    keep = packed_index[:, cols][window]  # [N]
    cu = cu_seq_lens(attention_mask)
    longest = int(attention_mask.sum(-1).max())
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest,
                  packed_layout=PackedLayout.from_cu_seq_lens(cu))
    return PackedBatch(ids, pos, window, keep, kwargs)


def group_mask(prompt_length: int, response_lengths: list[int]) -> torch.Tensor:
    """``[L, L]`` bool attention mask of ``prompt || response_1 || ... || response_n``
    (``L = prompt_length + sum(response_lengths)``): causal, and a response attends to the prompt
    and to itself only."""
    segment = torch.repeat_interleave(torch.arange(len(response_lengths) + 1),
                                      torch.tensor([prompt_length, *response_lengths]))  # [L]
    causal = torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
    return causal & ((segment[:, None] == segment[None, :]) | (segment[None, :] == 0))


def _grouped(input_ids, attention_mask, position_ids, response_length,
             groups: list[list[int]]) -> PackedBatch:
    """``prompt_g, response_g1 .. response_gn`` per group (see the module docstring)."""
    mask = attention_mask.bool()
    rows, length = mask.shape
    prompt_cols = length - response_length
    packed_index = torch.full((rows, length), -1, dtype=torch.long)  # [B, L]; -1 = not packed
    flat_src: list[torch.Tensor] = []  # indices into the flattened [B * L] row-major inputs
    blocks: list[PackedBlock] = []
    cursor = 0
    for group in groups:
        block_start = cursor
        cols = mask[group[0], :prompt_cols].nonzero().squeeze(-1)
        packed_index[torch.tensor(group)[:, None], cols[None]] = torch.arange(cursor, cursor + len(cols))
        flat_src.append(group[0] * length + cols)
        cursor += len(cols)
        response_lengths = []
        for row in group:
            rcols = prompt_cols + mask[row, prompt_cols:].nonzero().squeeze(-1)
            packed_index[row, rcols] = torch.arange(cursor, cursor + len(rcols))
            flat_src.append(row * length + rcols)
            response_lengths.append(len(rcols))
            cursor += len(rcols)
        blocks.append(PackedBlock(block_start, cursor, group_mask(len(cols), response_lengths),
                                  (len(cols), *response_lengths)))
    src = torch.cat(flat_src)
    ids = input_ids.reshape(-1)[src].unsqueeze(0)  # [1, T]
    pos = position_ids.reshape(-1)[src].unsqueeze(0)  # [1, T]
    cols = slice(prompt_cols - 1, length - 1)
    window = mask[:, cols]  # [B, R]
    keep = packed_index[:, cols][window]  # [N]
    assert bool((keep >= 0).all()), "every valid response-predicting position is packed"
    return PackedBatch(ids, pos, window, keep, {"packed_layout": PackedLayout(blocks)})


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
         response_length: int, groups: Optional[list[list[int]]] = None) -> PackedBatch:
    """Pack ``[B, L]`` rows; with ``groups`` (:func:`prompt_groups`, the prefix grouper) rows
    sharing a prompt share one copy of it (only when some prompt is actually shared; otherwise
    the row layout is used)."""
    if not has_shared_prompts(groups):
        return _row_packed(input_ids, attention_mask, position_ids, response_length)
    device = input_ids.device
    packed = _grouped(input_ids.cpu(), attention_mask.cpu(), position_ids.cpu(), response_length, groups)
    return packed if device.type == "cpu" else packed.to(device)


def computed_tokens(attention_mask: torch.Tensor, response_length: int, packed: bool,
                    groups: Optional[list[list[int]]] = None) -> int:
    """Tokens a forward over this micro-batch runs through the model.

    Padded: ``B x L'`` (``L'`` after dropping all-padding leading columns); packed: the valid
    tokens; grouped (``groups``, packed only): each shared prompt once.
    """
    if not packed:
        return attention_mask.shape[0] * (attention_mask.shape[1] - first_valid_column(attention_mask))
    if groups is not None:
        return sum(group_token_counts(attention_mask, response_length, groups))
    return int(attention_mask.sum())
