"""DPO inputs: preference pairs tokenised for a causal-LM policy, in the rollout's batch layout.

The pairs come from the reward model's loaders (:func:`hybrid_rl.data.preference.iter_preference_pairs`,
every row shape it accepts, the same ``data.bad_rows`` policy). Each pair is tokenised as TRL's
``DPOTrainer`` does for a conversational row: the prompt messages rendered by the chat template with
the generation prompt, then each response as the template renders the assistant turn (for ChatML
``"<answer><|im_end|>\\n"``: the end-of-turn token is the EOS).

Departures from TRL (1.16), each so the policy trains on exactly what it sees in RL:

* the rendered text is split at the end of the generation prompt and the two pieces are tokenised
  separately, so the prompt ids are the ones the rollout feeds the model; TRL tokenises the whole
  text and splits at the first differing token (the same ids unless tokens merge across the
  boundary, which a ChatML template's ``"assistant\\n"`` never does);
* a string prompt is a user turn rendered by the chat template (as the RM and RL data treat it);
  TRL tokenises a non-conversational row as raw text;
* the EOS is appended only when the rendered assistant turn holds none (TRL adds it to
  non-conversational rows only);
* ``data.max_prompt_length`` caps the prompt (veRL's ``data.truncation``: ``left`` keeps its end,
  ``right`` its start, ``error`` refuses the row); ``data.max_length`` caps prompt + response by
  cutting the responses' ends (TRL's ``truncation_mode="keep_start"``), or refuses the row under
  ``error``. TRL drops a pair whose prompt fills ``max_length``; here it is a bad row.

Batch layout (:func:`dpo_batch`): rows INTERLEAVED, row ``2i`` pair ``i``'s chosen and row ``2i+1``
its rejected response, so a split into an even number of rows never separates a pair. Prompts
left-padded ``prompts [2B, P]``, responses right-padded ``responses`` / ``response_mask [2B, R]``,
``input_ids`` / ``attention_mask`` / ``position_ids [2B, P+R]``
(:func:`hybrid_rl.data.layout.prompt_response_tensors`, as SFT and the rollout lay them out).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from hybrid_rl.data.bad_rows import BadRows, RowError
from hybrid_rl.data.dataset import resolve_pad_token_id
from hybrid_rl.data.preference import PreferencePair, iter_preference_pairs
from hybrid_rl.data.reward_data import SIDES, TRUNCATIONS
from hybrid_rl.data.tokenized import tokenize_rows

__all__ = ["DPODataset", "dpo_batch", "dpo_pair_ids", "dpo_problems"]

PairIds = tuple[list[int], list[int], list[int]]
"""``(prompt_ids, chosen_ids, rejected_ids)`` of one pair."""


def dpo_problems(max_prompt_length: Optional[int], max_length: Optional[int], truncation: str) -> list[str]:
    """One line per wrong length / truncation setting (None: no limit)."""
    errors = []
    if truncation not in TRUNCATIONS:
        errors.append(f"data.truncation={truncation!r} must be one of {TRUNCATIONS}: error refuses an overlong pair, "
                      "left keeps the prompt's end, right its start (responses always keep their start).")
    for key, value in (("max_prompt_length", max_prompt_length), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            errors.append(f"data.{key}={value!r} must be a positive number of tokens (or null for no limit).")
    if not errors and max_prompt_length is not None and max_length is not None and max_prompt_length >= max_length:
        errors.append(f"data.max_prompt_length={max_prompt_length} leaves no room for a response within "
                      f"data.max_length={max_length}. Fix: set data.max_length above data.max_prompt_length.")
    return errors


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _completion_ids(tokenizer: Any, prompt: list[dict], prompt_text: str, response: str) -> list[int]:
    """The assistant turn's ids as the chat template renders it after ``prompt_text``, EOS-terminated."""
    full = _render(tokenizer, list(prompt) + [{"role": "assistant", "content": response}], False)
    if not full.startswith(prompt_text) or len(full) == len(prompt_text):
        raise ValueError("the tokenizer's chat template does not render the conversation as the generation prompt "
                         "followed by the assistant turn, so the response cannot be cut out exactly. Fix: use a chat "
                         "model's tokenizer (model.tokenizer_path) with a ChatML-like template.")
    ids = tokenizer.encode(full[len(prompt_text):], add_special_tokens=False)
    eos = tokenizer.eos_token_id
    return ids if eos is None or eos in ids else ids + [eos]


def _cut_prompt(ids: list[int], max_prompt_length: Optional[int], truncation: str) -> list[int]:
    if max_prompt_length is None or len(ids) <= max_prompt_length:
        return ids
    if truncation == "error":
        raise RowError(f"a prompt of {len(ids)} tokens exceeds data.max_prompt_length={max_prompt_length}. Fix: raise "
                       "data.max_prompt_length or set data.truncation=left (keep the prompt's end) or right.",
                       "prompt over max_prompt_length")
    return ids[-max_prompt_length:] if truncation == "left" else ids[:max_prompt_length]


def _cut_response(ids: list[int], side: str, prompt_len: int, max_length: Optional[int], truncation: str) -> list[int]:
    if max_length is None or prompt_len + len(ids) <= max_length:
        return ids
    if truncation == "error":
        raise RowError(f"prompt + {side} response is {prompt_len + len(ids)} tokens, over data.max_length="
                       f"{max_length}. Fix: raise data.max_length or set data.truncation=left or right (the "
                       "response's end is cut).", "pair over max_length")
    if prompt_len >= max_length:
        raise RowError(f"the prompt's {prompt_len} tokens fill data.max_length={max_length}: no {side} token is left "
                       "to train on. Fix: raise data.max_length or lower data.max_prompt_length.",
                       "no room for a response")
    return ids[:max_length - prompt_len]  # keep the start: the response must follow the prompt


def dpo_pair_ids(tokenizer: Any, pair: PreferencePair, max_prompt_length: Optional[int] = None,
                 max_length: Optional[int] = None, truncation: str = "error") -> PairIds:
    """``(prompt_ids, chosen_ids, rejected_ids)`` of one pair (see the module docstring); a
    :class:`RowError` for an overlong pair under ``truncation=error`` or responses that tokenise
    identically."""
    if truncation not in TRUNCATIONS:
        raise ValueError(dpo_problems(max_prompt_length, max_length, truncation)[0])
    prompt_text = _render(tokenizer, pair.prompt, True)
    prompt = _cut_prompt(tokenizer.encode(prompt_text, add_special_tokens=False), max_prompt_length, truncation)
    chosen, rejected = (_cut_response(_completion_ids(tokenizer, pair.prompt, prompt_text, text), side, len(prompt),
                                      max_length, truncation)
                        for side, text in zip(SIDES, (pair.chosen, pair.rejected)))
    if chosen == rejected:
        raise RowError(f"the chosen and rejected responses tokenise to the same {len(chosen)} tokens: the pair says "
                       "nothing. Fix: drop the row (or raise data.max_length if truncation cut the difference).",
                       "identical after tokenisation")
    return prompt, chosen, rejected


def dpo_batch(rows: Sequence[PairIds], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The policy's tensors for B tokenised pairs, 2B rows interleaved (row 2i chosen, 2i+1 rejected):
    ``prompts [2B, P]``, ``responses`` / ``response_mask [2B, R]``, ``input_ids`` /
    ``attention_mask`` / ``position_ids [2B, P+R]``."""
    from hybrid_rl.data.layout import prompt_response_tensors

    if not rows:
        raise ValueError("dpo_batch needs at least one tokenised pair")
    prompts = [prompt for prompt, _, _ in rows for _ in SIDES]
    responses = [response for _, chosen, rejected in rows for response in (chosen, rejected)]
    return prompt_response_tensors(prompts, responses, [[1] * len(r) for r in responses], pad_token_id)


class DPODataset:
    """Tokenised preference pairs for a policy, for the resumable loader: item ``i`` is pair ``i``;
    ``collate_fn`` builds :func:`dpo_batch` tensors plus ``data_source [2B]``.

    Args:
        files: parquet / JSONL files in any shape :mod:`hybrid_rl.data.preference` accepts.
        tokenizer: the policy's tokenizer (its chat template renders the prompts and responses).
        prompt_key / chosen_key / rejected_key: column names (``data.*_key``).
        max_prompt_length: most prompt tokens after the chat template (None: no limit).
        max_length: most tokens of prompt + one response (None: no limit).
        truncation: error | left | right for longer ones (see the module docstring).
        bad_rows / max_bad_fraction: the ``data.bad_rows`` policy (:class:`BadRows`).
    """

    def __init__(self, files: Any, tokenizer: Any, prompt_key: str = "prompt", chosen_key: str = "chosen",
                 rejected_key: str = "rejected", max_prompt_length: Optional[int] = 512,
                 max_length: Optional[int] = 1024, truncation: str = "error", bad_rows: str = "error",
                 max_bad_fraction: float = 0.01):
        problems = dpo_problems(max_prompt_length, max_length, truncation)
        if problems:
            raise ValueError(problems[0])
        policy = BadRows(bad_rows, max_bad_fraction, what="preference pairs")
        self.pad_token_id = resolve_pad_token_id(tokenizer)
        self.pairs: list[PreferencePair]
        self.rows: list[PairIds]
        self.pairs, self.rows = tokenize_rows(
            iter_preference_pairs(files, prompt_key, chosen_key, rejected_key, bad_rows=policy), policy,
            lambda pair: dpo_pair_ids(tokenizer, pair, max_prompt_length, max_length, truncation),
            f"no preference pairs in {files}. Fix: pass non-empty files.")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        prompt, chosen, rejected = self.rows[index]
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected,
                "data_source": self.pairs[index].data_source}

    def collate_fn(self, items: Sequence[dict]) -> dict[str, Any]:
        from hybrid_rl.protocol_utils import to_object_array

        out: dict[str, Any] = dpo_batch([(i["prompt"], i["chosen"], i["rejected"]) for i in items], self.pad_token_id)
        out["data_source"] = to_object_array([i["data_source"] for i in items for _ in SIDES])  # [2B]
        return out
