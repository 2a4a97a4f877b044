"""Preference pairs (a prompt, a chosen and a rejected response) from the public file formats.

Accepted row shapes (parquet or JSONL; the column names are keys, as OpenRLHF's ``--prompt_key`` /
``--chosen_key`` / ``--rejected_key`` and TRL's ``prompt`` / ``chosen`` / ``rejected``):

* **explicit prompt, string responses** (TRL "standard"): ``prompt`` a string or chat messages,
  ``chosen`` / ``rejected`` the response texts;
* **chat conversations** (UltraFeedback-binarized, TRL "conversational"): ``chosen`` / ``rejected``
  message lists that both start with the conversation so far and end with one assistant message;
  a ``prompt`` column, if present, may be a string (the first user turn) or messages, or absent
  (the shared prefix of the two conversations is the prompt);
* **HH-RLHF strings**: ``chosen`` / ``rejected`` whole dialogues ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``
  without a prompt column; parsed into messages, then as above;
* **TRL's implicit prompt**: other ``chosen`` / ``rejected`` strings without a prompt column; their
  common start (to a word boundary) is the prompt (:func:`implicit_prompt`).

An optional ``margin`` column (TRL's) is kept for the margin Bradley-Terry loss. A malformed row is a
:class:`~hybrid_rl.data.bad_rows.RowError` naming the fix, raised or skipped by ``data.bad_rows``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from hybrid_rl.data.bad_rows import BadRows, RowError
from hybrid_rl.data.files import expand_data_files, numbered_rows

__all__ = ["PreferencePair", "implicit_prompt", "iter_preference_pairs", "load_preference_pairs", "pair_from_row", "parse_hh_dialogue"]

_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


@dataclass
class PreferencePair:
    """One comparison: the same prompt, a preferred and a dispreferred response."""

    prompt: list[dict]
    """Chat messages up to (and including) the last user turn."""
    chosen: str
    """The preferred assistant response."""
    rejected: str
    """The dispreferred assistant response."""
    data_source: str = ""
    """The row's data source, if the file has one."""
    margin: Optional[float] = None
    """How much better ``chosen`` is (TRL's ``margin`` column), if given."""
    kind: str = ""
    """What is wrong with ``rejected`` (the ``rejected_kind`` column of the generated pairs, see
    :mod:`hybrid_rl.data.rlhf_data`), if the file says; validation reports the accuracy per kind."""


def parse_hh_dialogue(text: str) -> list[dict]:
    """``"\\n\\nHuman: a\\n\\nAssistant: b"`` -> ``[{"role": "user", ...}, {"role": "assistant", ...}]``."""
    parts = _HH_TURN.split("\n\n" + text.lstrip("\n"))
    if len(parts) < 3 or parts[0].strip():
        raise RowError("not an HH-RLHF dialogue (it must start with '\\n\\nHuman: ')", "not an HH-RLHF dialogue")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)]


def _is_hh(text: str) -> bool:
    return text.lstrip("\n").startswith("Human: ")


def implicit_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """TRL's implicit-prompt pair (``{"chosen": "The sky is blue.", "rejected": "The sky is green."}``)
    as ``(prompt, chosen, rejected)``: the prompt is the texts' common start, cut back to a word
    boundary (``"The sky is"``); the responses are the rest (``"blue."``, ``"green."``)."""
    if chosen == rejected:
        raise RowError("the chosen and rejected texts are identical: the pair says nothing. Fix: drop the row.",
                       "identical chosen and rejected")
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    n = max((i for i in range(n + 1) if i < len(chosen) and chosen[i].isspace()), default=0)  # a word boundary
    if not chosen[:n].strip():
        raise RowError("string 'chosen' and 'rejected' without a prompt column share no prompt (neither an HH-RLHF "
                       "dialogue nor TRL's implicit prompt). Fix: add the prompt column (data.prompt_key=).",
                       "no shared prompt")
    return chosen[:n].rstrip(), chosen[n:].strip(), rejected[n:].strip()


def _messages(value: Any, what: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise RowError(f"{what} must be a string or a list of {{role, content}} messages, got {type(value).__name__}",
                   f"{what} not text or messages")


def _split(conversation: list[dict], prefix_len: int, what: str) -> str:
    rest = conversation[prefix_len:]
    if len(rest) != 1 or rest[0]["role"] != "assistant":
        raise RowError(f"{what} must end with exactly one assistant message after the shared prompt, got "
                       f"{[m['role'] for m in rest]} (the conversations diverge before the last turn)",
                       "conversations diverge before the last turn")
    return rest[0]["content"]


def _shared_prefix(a: list[dict], b: list[dict]) -> int:
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return n


def pair_from_row(row: dict, prompt_key: str = "prompt", chosen_key: str = "chosen",
                  rejected_key: str = "rejected", margin_key: str = "margin") -> PreferencePair:
    """One :class:`PreferencePair` from a row in any accepted shape (ValueError with the fix otherwise)."""
    for key, flag in ((chosen_key, "chosen_key"), (rejected_key, "rejected_key")):
        if row.get(key) is None:
            raise RowError(f"no {key!r} column (columns: {sorted(row)}). Fix: name the column with data.{flag}= "
                           f"(OpenRLHF --{flag}, TRL 'chosen'/'rejected').", f"no {key!r}")
    chosen, rejected, prompt = row[chosen_key], row[rejected_key], row.get(prompt_key)
    if isinstance(chosen, str) and isinstance(rejected, str) and prompt is None:
        if _is_hh(chosen) or _is_hh(rejected):
            chosen, rejected = parse_hh_dialogue(chosen), parse_hh_dialogue(rejected)
        else:  # TRL's implicit prompt: the shared start of the two texts
            prompt, chosen, rejected = implicit_prompt(chosen, rejected)
    if isinstance(chosen, str) and isinstance(rejected, str):
        prompt_messages, chosen_text, rejected_text = _messages(prompt, f"{prompt_key!r}"), chosen, rejected
    else:
        chosen, rejected = _messages(chosen, f"{chosen_key!r}"), _messages(rejected, f"{rejected_key!r}")
        shared = _shared_prefix(chosen, rejected)
        if shared == 0 and prompt is not None:  # the responses alone, the prompt in its own column
            prefix = _messages(prompt, f"{prompt_key!r}")
            chosen, rejected = prefix + chosen, prefix + rejected
            shared = _shared_prefix(chosen, rejected)
        if shared == 0 or chosen[shared - 1]["role"] != "user":
            raise RowError(f"{chosen_key!r} and {rejected_key!r} share no conversation ending with a user turn. "
                           f"Fix: give the prompt in a {prompt_key!r} column.", "no shared prompt")
        prompt_messages = chosen[:shared]
        chosen_text, rejected_text = _split(chosen, shared, chosen_key), _split(rejected, shared, rejected_key)
    for text, key in ((chosen_text, chosen_key), (rejected_text, rejected_key)):
        if not str(text).strip():
            raise RowError(f"the {key!r} response is empty. Fix: drop the row or fill in the response.",
                           "empty response")
    if chosen_text == rejected_text:
        raise RowError("the chosen and rejected responses are identical: the pair says nothing. Fix: drop the row.",
                       "identical chosen and rejected")
    margin = row.get(margin_key)
    return PreferencePair(prompt_messages, str(chosen_text), str(rejected_text),
                          data_source=str(row.get("data_source") or ""),
                          margin=float(margin) if margin is not None else None,
                          kind=str(row.get("rejected_kind") or ""))


def iter_preference_pairs(files: str | os.PathLike | Sequence[str | os.PathLike], prompt_key: str = "prompt",
                          chosen_key: str = "chosen", rejected_key: str = "rejected", margin_key: str = "margin",
                          bad_rows: Optional[BadRows] = None) -> Iterator[tuple[str, int, PreferencePair]]:
    """``(file, row, pair)`` for every good row of the files (paths, folders or globs; rows numbered
    from 1); ``bad_rows`` decides about the others, unreadable lines too (default: raise naming file
    and row)."""
    policy = bad_rows if bad_rows is not None else BadRows(what="preference pairs")
    for path in expand_data_files(files):
        for index, row in numbered_rows(path, policy):
            pair = policy.parse(path, index, pair_from_row, row, prompt_key, chosen_key, rejected_key, margin_key)
            if pair is not None:
                yield path, index, pair


def load_preference_pairs(files: str | os.PathLike | Sequence[str | os.PathLike], prompt_key: str = "prompt",
                          chosen_key: str = "chosen", rejected_key: str = "rejected", margin_key: str = "margin",
                          bad_rows: str = "error", max_bad_fraction: float = 0.01) -> list[PreferencePair]:
    """Every good row of the files as a :class:`PreferencePair` (``data.bad_rows`` policy, then its
    summary line); no pair at all is a ValueError."""
    policy = BadRows(bad_rows, max_bad_fraction, what="preference pairs")
    pairs = [pair for _, _, pair in iter_preference_pairs(files, prompt_key, chosen_key, rejected_key, margin_key,
                                                          policy)]
    policy.finish()
    if not pairs:
        raise ValueError(f"no preference pairs in {files}. Fix: pass non-empty files.")
    return pairs
