"""Supervised fine-tuning examples: rows -> chat conversations -> token ids with a loss mask.

Rows (parquet or JSONL) in veRL's SFT shapes, columns named by key:

* ``data.prompt_key`` (a string or chat messages) + ``data.response_key`` (the response text);
* ``data.multiturn.enable`` with ``data.multiturn.messages_key``: a whole conversation; every
  assistant turn is trained on.

:func:`tokenize_example` renders the conversation with the tokenizer's chat template piece by
piece: the text before each assistant turn (rendered with ``add_generation_prompt``, exactly what
the model sees as a prompt at inference and in RL) and each assistant turn up to its end-of-turn
token. The loss mask is 1 on the assistant turns' tokens and 0 on everything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from hybrid_rl.data.bad_rows import BadRows, RowError
from hybrid_rl.data.files import expand_data_files, numbered_rows
from hybrid_rl.data.tokenized import tokenize_rows

__all__ = ["TRUNCATIONS", "SFTDataset", "SFTExample", "example_from_row", "load_sft_examples", "sft_batch",
           "tokenize_example"]

TRUNCATIONS = ("error", "left", "right")
"""veRL's ``data.truncation`` for SFT: error, left (keep the end) or right (keep the start)."""


@dataclass
class SFTExample:
    """One training conversation; the assistant turns are the targets."""

    messages: list[dict]
    """Chat messages, at least one assistant turn."""
    data_source: str = ""
    """The row's data source, if any."""
    extra: dict = field(default_factory=dict)
    """``reward_model`` and ``extra_info`` of the row, if any (to judge generations later)."""


def _as_messages(value: Any, key: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                          for m in value):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise RowError(f"{key!r} must be a string or a non-empty list of {{role, content}} messages",
                   f"{key!r} not text or messages")


def _lookup(row: dict, key: str, dict_keys: Optional[Sequence[str]], flag: str) -> Any:
    """``row[key]``, then down ``dict_keys`` (veRL's ``data.prompt_dict_keys`` / ``response_dict_keys``:
    ``extra_info`` -> ``question``); None when the column is absent."""
    value, path = row.get(key), key
    for name in dict_keys or ():
        if value is None:
            return None
        if not isinstance(value, dict) or name not in value:
            raise RowError(f"{path!r} has no field {name!r} (it is {_shape(value)}). Fix: set data.{flag}_dict_keys "
                           "to the fields that lead to the text.", f"no {path}.{name}")
        value, path = value[name], f"{path}.{name}"
    return value


def _shape(value: Any) -> str:
    return f"a dict with {sorted(value)}" if isinstance(value, dict) else f"a {type(value).__name__}"


def example_from_row(row: dict, prompt_key: str = "prompt", response_key: str = "response",
                     messages_key: Optional[str] = None, prompt_dict_keys: Optional[Sequence[str]] = None,
                     response_dict_keys: Optional[Sequence[str]] = None) -> SFTExample:
    """One :class:`SFTExample` (a RowError with the fix for a malformed row)."""
    if messages_key is not None:
        if row.get(messages_key) is None:
            raise RowError(f"no {messages_key!r} column (columns: {sorted(row)}). Fix: set "
                           "data.multiturn.messages_key to the column holding the conversation.", f"no {messages_key!r}")
        messages = _as_messages(row[messages_key], messages_key)
        if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
            raise RowError(f"the {messages_key!r} conversation has no non-empty assistant turn to train on.",
                           "no assistant turn")
    else:
        prompt = _lookup(row, prompt_key, prompt_dict_keys, "prompt")
        response = _lookup(row, response_key, response_dict_keys, "response")
        for value, key, name in ((prompt, prompt_key, "prompt"), (response, response_key, "response")):
            if value is None:
                raise RowError(f"no {key!r} column (columns: {sorted(row)}). Fix: set data.{name}_key to the right "
                               "column.", f"no {key!r}")
        if not isinstance(response, str) or not response.strip():
            raise RowError(f"the {response_key!r} response is empty or not a string. Fix: drop or fill the row.",
                           "empty response")
        messages = _as_messages(prompt, prompt_key) + [{"role": "assistant", "content": response}]
    extra = {k: row[k] for k in ("reward_model", "extra_info") if row.get(k) is not None}
    return SFTExample(messages, str(row.get("data_source") or ""), extra)


def load_sft_examples(files: str | os.PathLike | Sequence[str | os.PathLike], prompt_key: str = "prompt",
                      response_key: str = "response", messages_key: Optional[str] = None, *,
                      prompt_dict_keys: Optional[Sequence[str]] = None, response_dict_keys: Optional[Sequence[str]] = None,
                      bad_rows: Optional[BadRows] = None) -> list[tuple[str, int, SFTExample]]:
    """``(file, row, example)`` for every good row of the files (paths, folders or globs; rows numbered
    from 1); a bad or unreadable row is handled by ``bad_rows`` (default: raise naming file and row;
    the caller calls its ``finish``)."""
    policy = bad_rows if bad_rows is not None else BadRows(what="SFT rows")
    examples = []
    for path in expand_data_files(files):
        for index, row in numbered_rows(path, policy):
            example = policy.parse(path, index, example_from_row, row, prompt_key, response_key, messages_key,
                                   prompt_dict_keys, response_dict_keys)
            if example is not None:
                examples.append((path, index, example))
    if bad_rows is None:
        policy.finish()
    return examples


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _segments(tokenizer: Any, messages: list[dict]) -> list[tuple[str, int]]:
    """``(text, is_target)`` pieces whose concatenation is the rendered conversation."""
    pieces, done = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = _render(tokenizer, messages[:i], True), _render(tokenizer, messages[: i + 1], False)
        if not (before.startswith(done) and after.startswith(before)):
            raise ValueError("the tokenizer's chat template does not render a conversation as a prefix of its "
                             "continuation, so assistant turns cannot be masked exactly. Fix: use a chat model's "
                             "tokenizer (data.tokenizer / model.tokenizer_path) with a ChatML-like template.")
        pieces += [(before[len(done):], 0), (after[len(before):], 1)]
        done = after
    rest = _render(tokenizer, messages, False)[len(done):]
    return pieces + ([(rest, 0)] if rest else [])


def tokenize_example(tokenizer: Any, messages: list[dict], max_length: int,
                     truncation: str = "error") -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one conversation, at most ``max_length`` tokens (see the module
    docstring); ``truncation``: error | left | right (veRL's ``data.truncation``)."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation={truncation!r} must be one of {TRUNCATIONS}.")
    ids: list[int] = []
    mask: list[int] = []
    for text, target in _segments(tokenizer, messages):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [target] * len(piece)
    if len(ids) > max_length:
        if truncation == "error":
            raise ValueError(f"a conversation of {len(ids)} tokens exceeds data.max_length={max_length}. Fix: raise "
                             "data.max_length or set data.truncation=right (keep the start) or left (keep the end).")
        ids, mask = (ids[:max_length], mask[:max_length]) if truncation == "right" else (ids[-max_length:],
                                                                                          mask[-max_length:])
    if not any(mask):
        raise ValueError(f"no assistant token is left within data.max_length={max_length}: nothing to train on. "
                         "Fix: raise data.max_length or truncate from the other side.")
    return ids, mask


def sft_batch(rows: Sequence[tuple[list[int], list[int]]], pad_token_id: int) -> dict[str, Any]:
    """The actor's update tensors for tokenised conversations (``(input_ids, loss_mask)`` pairs):
    each row split before its first target token into a left-padded prompt ``[B, P]`` and a
    right-padded response ``[B, R]`` whose ``response_mask`` is the rest of the loss mask (0 on later
    user turns). Keys: ``prompts, responses, response_mask, input_ids, attention_mask, position_ids``
    (:data:`hybrid_rl.trainer.sft.contracts.SFT_BATCH`), what the ``nll`` objective's update reads; no
    PPO inputs. Train with ``actor.objective={name: nll}``."""
    from hybrid_rl.data.layout import prompt_response_tensors

    if not rows:
        raise ValueError("sft_batch needs at least one tokenised conversation")
    splits = [mask.index(1) for _, mask in rows]  # each row has a target token (tokenize_example)
    out = prompt_response_tensors([ids[:cut] for (ids, _), cut in zip(rows, splits)],
                                  [ids[cut:] for (ids, _), cut in zip(rows, splits)],
                                  [mask[cut:] for (_, mask), cut in zip(rows, splits)], pad_token_id)
    return out


class SFTDataset:
    """Tokenised SFT conversations for the resumable loader: item ``i`` is ``(input_ids, loss_mask)``
    and ``collate_fn`` builds :func:`sft_batch` tensors plus the ``data_source`` column."""

    def __init__(self, files: Any, tokenizer: Any, prompt_key: str = "prompt", response_key: str = "response",
                 messages_key: Optional[str] = None, max_length: int = 1024, truncation: str = "error", *,
                 prompt_dict_keys: Optional[Sequence[str]] = None, response_dict_keys: Optional[Sequence[str]] = None,
                 bad_rows: str = "error", max_bad_fraction: float = 0.01):
        policy = BadRows(bad_rows, max_bad_fraction, what="SFT rows")
        loaded = load_sft_examples(files, prompt_key, response_key, messages_key, prompt_dict_keys=prompt_dict_keys,
                                   response_dict_keys=response_dict_keys, bad_rows=policy)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.examples, self.rows = tokenize_rows(
            loaded, policy, lambda example: tokenize_example(tokenizer, example.messages, max_length, truncation),
            f"no SFT examples in {files}. Fix: pass non-empty data files.")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        ids, mask = self.rows[index]
        return {"ids": ids, "mask": mask, "data_source": self.examples[index].data_source}

    def collate_fn(self, items: Sequence[dict]) -> dict[str, Any]:
        from hybrid_rl.data.dataset import _object_array

        out = sft_batch([(item["ids"], item["mask"]) for item in items], self.pad_token_id)
        out["data_source"] = _object_array([item["data_source"] for item in items])
        return out
