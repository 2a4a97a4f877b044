"""Reward-model inputs: conversations rendered through the reward model's chat template.

A reward model scores a whole conversation, ``prompt messages + one assistant message``, rendered
by its own tokenizer's chat template (as TRL's ``RewardTrainer`` and veRL's reward-model worker
with ``input_tokenizer`` do), and reads its score at the last token. The same rendering is used
when it is trained on preference pairs and when it scores a policy's responses in RL, so the
two see the same text whatever tokenizer the policy has.

Rows are right-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` ``[B, L]``; a pair
batch carries a ``chosen_`` and a ``rejected_`` set of them (one row per pair, so splitting rows
over data-parallel ranks or micro-batches never separates a pair) and ``margin [B]``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from hybrid_rl.data.bad_rows import BadRows, RowError
from hybrid_rl.data.preference import PreferencePair, iter_preference_pairs
from hybrid_rl.data.tokenized import tokenize_rows

__all__ = ["PreferenceDataset", "TRUNCATIONS", "rm_sequence_ids", "sequence_tensors"]

TRUNCATIONS = ("error", "left", "right")
SIDES = ("chosen", "rejected")


def rm_sequence_ids(tokenizer: Any, prompt: list[dict], response: str, max_length: Optional[int],
                    truncation: str = "error", allow_empty: bool = False) -> list[int]:
    """Token ids of ``prompt + [assistant: response]`` through the chat template, at most
    ``max_length`` (None: no limit; ``truncation``: error | left (keep the end, where the score is
    read) | right). An empty response is an error unless ``allow_empty`` (a policy's sample)."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation={truncation!r} must be one of {TRUNCATIONS}.")
    if not allow_empty and not str(response).strip():
        raise ValueError("the response is empty; a reward model scores a response. Fix: drop the row.")
    text = tokenizer.apply_chat_template(list(prompt) + [{"role": "assistant", "content": str(response)}],
                                         tokenize=False, add_generation_prompt=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_length is not None and len(ids) > max_length:
        if truncation == "error":
            raise ValueError(f"a conversation of {len(ids)} tokens exceeds data.max_length={max_length}. Fix: "
                             "raise data.max_length or set data.truncation=left (keep the end, where the "
                             "score is read) or right.")
        ids = ids[-max_length:] if truncation == "left" else ids[:max_length]
    return ids


def sequence_tensors(sequences: Sequence[Sequence[int]], pad_token_id: int,
                     width: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` ``[B, width]`` (default
    width: the longest sequence)."""
    width = width if width is not None else max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[i, :len(seq)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def pair_tensors(chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]], pad_token_id: int,
                 margins: Optional[Sequence[float]] = None) -> dict[str, torch.Tensor]:
    """``chosen_*`` and ``rejected_*`` :func:`sequence_tensors` of B pairs and ``margin [B]`` (0 = none)."""
    out: dict[str, torch.Tensor] = {}
    for side, seqs in zip(SIDES, (chosen, rejected)):
        out.update({f"{side}_{k}": v for k, v in sequence_tensors(seqs, pad_token_id).items()})
    out["margin"] = torch.tensor(list(margins) if margins is not None else [0.0] * len(chosen), dtype=torch.float32)
    return out


def _pair_ids(tokenizer: Any, pair: PreferencePair, max_length: int, truncation: str) -> tuple[list[int], list[int]]:
    """The chosen and rejected token ids of one pair; a RowError when truncation made them equal."""
    chosen, rejected = (rm_sequence_ids(tokenizer, pair.prompt, text, max_length, truncation)
                        for text in (pair.chosen, pair.rejected))
    if chosen == rejected:
        raise RowError(f"chosen and rejected are the same {max_length} tokens after truncation. Fix: raise "
                       "data.max_length.", "identical after truncation")
    return chosen, rejected


class PreferenceDataset:
    """Tokenised preference pairs for the resumable loader (see the module docstring).

    Args:
        files: parquet / JSONL files in any shape :mod:`hybrid_rl.data.preference` accepts.
        tokenizer: the reward model's tokenizer (its chat template renders the conversations).
        prompt_key / chosen_key / rejected_key / margin_key: column names.
        max_length: most tokens of one rendered conversation.
        truncation: error | left | right for longer ones.
    """

    def __init__(self, files: Any, tokenizer: Any, prompt_key: str = "prompt", chosen_key: str = "chosen",
                 rejected_key: str = "rejected", margin_key: str = "margin", max_length: int = 1024,
                 truncation: str = "error", bad_rows: str = "error", max_bad_fraction: float = 0.01):
        policy = BadRows(bad_rows, max_bad_fraction, what="preference pairs")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pairs: list[PreferencePair]
        self.rows: list[tuple[list[int], list[int]]]
        self.pairs, self.rows = tokenize_rows(
            iter_preference_pairs(files, prompt_key, chosen_key, rejected_key, margin_key, policy), policy,
            lambda pair: _pair_ids(tokenizer, pair, max_length, truncation),
            f"no preference pairs in {files}. Fix: pass non-empty files.")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        chosen, rejected = self.rows[index]
        pair = self.pairs[index]
        return {"chosen": chosen, "rejected": rejected, "margin": pair.margin or 0.0,
                "data_source": pair.data_source}

    def collate_fn(self, items: Sequence[dict]) -> dict[str, Any]:
        from hybrid_rl.protocol_utils import to_object_array

        out: dict[str, Any] = pair_tensors([i["chosen"] for i in items], [i["rejected"] for i in items],
                                           self.pad_token_id, [i["margin"] for i in items])
        out["data_source"] = to_object_array([i["data_source"] for i in items])
        return out
