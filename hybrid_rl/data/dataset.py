"""``RLHFDataset``: prompts in veRL's row schema -> token ids, plus a DataProto-ready collate.

Each row's chat messages are rendered with the tokenizer's chat template
(``add_generation_prompt=True``) and tokenized **once at load**; the ids are cached in one flat
int64 array so every epoch (and every DataLoader worker) only slices. Overlong prompts are either
dropped (``filter_overlong_prompts``) or cut according to ``truncation``. ``__getitem__`` returns
unpadded ids; :func:`collate_fn` left-pads a batch (prompts end where generation starts) and
builds ``position_ids``. Unlike veRL, no uid is assigned here: the trainer assigns one per prompt.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybrid_rl.data.bad_rows import BadRows
from hybrid_rl.data.files import expand_data_files, numbered_rows
from hybrid_rl.data.rows import check_required_columns, validate_row

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("left", "right", "middle", "error")
TENSOR_KEYS = ("input_ids", "attention_mask")


def truncate_ids(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens: ``left`` keeps the end, ``right`` the start,
    ``middle`` keeps ``max_length // 2`` tokens from the start and the rest from the end."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[len(ids) - max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + (ids[len(ids) - tail:] if tail else [])
    raise ValueError(f"truncation={mode!r} cannot cut a prompt; valid modes: {', '.join(TRUNCATION_MODES[:3])}")


def resolve_pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, falling back to eos (common for base-model tokenizers without a pad)."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        logger.warning("tokenizer has no pad_token_id; padding prompts with eos_token_id=%d", tokenizer.eos_token_id)
        return int(tokenizer.eos_token_id)
    raise ValueError(
        "tokenizer has neither pad_token_id nor eos_token_id; set tokenizer.pad_token before building the dataset"
    )


def _agent_scored(row: dict) -> bool:
    reward_model = row.get("reward_model")
    return isinstance(reward_model, dict) and reward_model.get("style") == "agent"


class RLHFDataset(torch.utils.data.Dataset):
    """Prompt dataset over one or more parquet/JSONL files in veRL's row schema.

    Args:
        data_files: a path or list of paths (files, folders or globs of ``.parquet``, ``.jsonl``, ``.json``,
            ``.jsonl.gz``, ``.json.gz``: :mod:`hybrid_rl.data.files`), concatenated in order.
        tokenizer: a HF tokenizer; its chat template renders the prompt messages.
        prompt_key: row field holding the chat messages.
        max_prompt_length: maximum prompt length in tokens (after the chat template).
        filter_overlong_prompts: drop rows longer than ``max_prompt_length`` (logged) instead of
            truncating them.
        truncation: what to do with an overlong row that is not filtered: ``left``, ``right``,
            ``middle`` or ``error``.
        return_raw_chat: include the raw messages as ``raw_prompt`` in each item.
        apply_chat_template: render messages with the chat template; if False the message contents
            are joined with newlines and encoded as plain text (base models).
        max_samples: keep a seeded random subset of this many rows (original order kept).
        seed: seed of the ``max_samples`` subset.
        tools: OpenAI function schemas passed to the chat template as ``tools=`` (multi-turn rollouts
            with tools); templates without tool support ignore them. None = not passed.
        bad_rows / max_bad_fraction: a malformed row stops the load (``error``) or is left out and
            reported (``skip``, up to that fraction of the rows; :mod:`hybrid_rl.data.bad_rows`).
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int = 512,
        filter_overlong_prompts: bool = True,
        truncation: str = "error",
        return_raw_chat: bool = True,
        apply_chat_template: bool = True,
        max_samples: int | None = None,
        seed: int = 1,
        tools: list[dict] | None = None,
        bad_rows: str = "error",
        max_bad_fraction: float = 0.01,
    ):
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"truncation={truncation!r} is not valid; choose one of {', '.join(TRUNCATION_MODES)}")
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length={max_prompt_length} must be >= 1")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples={max_samples} must be >= 1 (or None for all rows)")
        if apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template, which is needed to render the chat-message prompts; "
                "use an instruct/chat model (actor_rollout_ref.model.path) or a tokenizer folder whose "
                "tokenizer_config.json has a chat_template (data.tokenizer), or build RLHFDataset with "
                "apply_chat_template=False to encode the raw message text"
            )
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.filter_overlong_prompts = filter_overlong_prompts
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.apply_chat_template = apply_chat_template
        self.tools = tools
        self.pad_token_id = resolve_pad_token_id(tokenizer)
        self.data_files = _as_file_list(data_files)

        rows, origins = self._load_rows(self.data_files, BadRows(bad_rows, max_bad_fraction, what="prompt rows"))
        if max_samples is not None and max_samples < len(rows):
            keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=max_samples, replace=False))
            rows, origins = [rows[i] for i in keep], [origins[i] for i in keep]
        # veRL's optional agent_name column (multi-turn): every item carries it when any row has it
        self._has_agent_name = any(r["agent_name"] is not None for r in rows)
        token_ids = self._tokenize(rows)
        self._rows, token_ids = self._fit_length(rows, origins, token_ids)
        lengths = np.array([len(t) for t in token_ids], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])  # [N + 1]
        self._flat_ids = np.fromiter((t for ids in token_ids for t in ids), dtype=np.int64, count=int(lengths.sum()))

    # ---------------------------------------------------------------- loading

    def _load_rows(self, files: list[str], policy: BadRows) -> tuple[list[dict], list[tuple[str, int]]]:
        rows, origins = [], []
        for path in files:
            raw_rows = list(numbered_rows(path, policy))  # rows numbered from 1; unreadable lines to the policy
            if raw_rows:  # none readable (all skipped): the policy's summary says why
                check_required_columns([raw for _, raw in raw_rows], path=path, prompt_key=self.prompt_key)
            for number, raw in raw_rows:
                row = policy.parse(path, number, validate_row, raw, path=path, row_idx=number,
                                   prompt_key=self.prompt_key)
                if row is None:
                    continue
                # Default index = global position; veRL rows usually carry extra_info.index.
                row["index"] = row["extra_info"].get("index", len(rows))
                rows.append(row)
                origins.append((path, number))
        policy.finish()
        if not rows:
            raise ValueError(f"no usable rows in {files}; fix the rows or the column names (data.prompt_key)")
        return rows, origins

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        """The exact prompt text the model sees for ``messages``."""
        if self.apply_chat_template:
            extra = {"tools": self.tools} if self.tools else {}
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
        return "\n".join(m["content"] for m in messages)

    def _tokenize(self, rows: list[dict], chunk: int = 1024) -> list[list[int]]:
        texts = [self.render_prompt(r["prompt"]) for r in rows]
        # Chat templates add their own special tokens; plain text gets the tokenizer's defaults (BOS).
        add_special = not self.apply_chat_template
        ids: list[list[int]] = []
        for start in range(0, len(texts), chunk):
            enc = self.tokenizer(texts[start:start + chunk], add_special_tokens=add_special)
            ids.extend(list(x) for x in enc["input_ids"])
        return ids

    def _fit_length(self, rows, origins, token_ids):
        max_len = self.max_prompt_length
        longest = max(len(t) for t in token_ids)
        if self.filter_overlong_prompts:
            keep = [i for i, t in enumerate(token_ids) if len(t) <= max_len]
            if not keep:
                raise ValueError(
                    f"all {len(rows)} prompts are longer than max_prompt_length={max_len} tokens "
                    f"(shortest {min(len(t) for t in token_ids)}, longest {longest}); "
                    f"raise data.max_prompt_length to at least {longest} or shorten the prompts"
                )
            if len(keep) < len(rows):
                logger.info("filtered %d of %d prompts longer than max_prompt_length=%d tokens",
                            len(rows) - len(keep), len(rows), max_len)
            return [rows[i] for i in keep], [token_ids[i] for i in keep]
        if self.truncation == "error":
            for (path, row_idx), ids in zip(origins, token_ids):
                if len(ids) > max_len:
                    raise ValueError(
                        f"data file {path!r} row {row_idx}: prompt is {len(ids)} tokens, longer than "
                        f"max_prompt_length={max_len} with truncation='error'; raise data.max_prompt_length, "
                        f"set data.filter_overlong_prompts=true, or choose truncation left/right/middle"
                    )
        return rows, [truncate_ids(ids, max_len, self.truncation) for ids in token_ids]

    # ---------------------------------------------------------------- access

    def __len__(self) -> int:
        return len(self._rows)

    def data_sources(self, scored_only: bool = False) -> list[str]:
        """The distinct ``data_source`` values of the rows, in first-seen order; ``scored_only``: of the
        rows the reward function scores (not ``reward_model.style: agent``, which their agent scores)."""
        return list(dict.fromkeys(row["data_source"] for row in self._rows
                                  if not (scored_only and _agent_scored(row))))

    def agent_names(self) -> list[str]:
        """The distinct non-empty ``agent_name`` values of the rows (empty without the column)."""
        return list(dict.fromkeys(str(row["agent_name"]) for row in self._rows
                                  if isinstance(row.get("agent_name"), str) and row["agent_name"]))

    def prompt_lengths(self) -> np.ndarray:
        """Token length of every prompt, int64 [N]."""
        return np.diff(self._offsets)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = self._rows[item]
        ids = torch.from_numpy(self._flat_ids[self._offsets[item]:self._offsets[item + 1]].copy())
        out = {
            "input_ids": ids,  # [P_i], unpadded
            "attention_mask": torch.ones_like(ids),
            "data_source": row["data_source"],
            # Copies so a caller mutating a batch never alters the cached rows.
            "reward_model": copy.deepcopy(row["reward_model"]),
            "extra_info": copy.deepcopy(row["extra_info"]),
            "index": row["index"],
            "ability": row["ability"],
        }
        if self.return_raw_chat:
            out["raw_prompt"] = copy.deepcopy(row["prompt"])
        if self._has_agent_name:
            out["agent_name"] = row["agent_name"]
        return out

    def collate_fn(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """:func:`collate_fn` with this tokenizer's pad id."""
        return collate_fn(items, pad_token_id=self.pad_token_id)


def _as_file_list(data_files) -> list[str]:
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not files:
        raise ValueError("data_files is empty; pass at least one data file, folder or glob")
    return expand_data_files(files)


def _object_array(values: list[Any]) -> np.ndarray:
    # Filling element by element keeps shape [B] even when the values are equal-length lists
    # (np.array would build a 2-D array from e.g. a batch of message lists).
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def collate_fn(items: Sequence[dict[str, Any]], pad_token_id: int = 0) -> dict[str, Any]:
    """Batch dataset items into a dict for ``DataProto.from_single_dict``.

    Returns ``input_ids``, ``attention_mask``, ``position_ids`` as int64 [B, P] (left-padded to
    the longest prompt, P = max length) and every other field as a numpy object array [B].
    """
    if not items:
        raise ValueError("collate_fn got an empty batch")
    keys = set(items[0])
    for i, it in enumerate(items):
        if set(it) != keys:
            raise ValueError(f"collate_fn: item {i} has keys {sorted(it)}, item 0 has {sorted(keys)}")
    batch_size = len(items)
    max_len = max(int(it["input_ids"].shape[0]) for it in items)
    input_ids = torch.full((batch_size, max_len), pad_token_id, dtype=torch.int64)  # [B, P]
    attention_mask = torch.zeros((batch_size, max_len), dtype=torch.int64)  # [B, P]
    for i, it in enumerate(items):
        n = int(it["input_ids"].shape[0])
        input_ids[i, max_len - n:] = it["input_ids"]
        attention_mask[i, max_len - n:] = it["attention_mask"]
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, P], 0 on left padding
    out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    for key in sorted(keys - set(TENSOR_KEYS)):
        out[key] = _object_array([it[key] for it in items])
    return out
