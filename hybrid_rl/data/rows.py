"""Validating veRL-schema rows (read by :mod:`hybrid_rl.data.files`).

One row (one prompt) in veRL's schema::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],          # chat messages, non-empty
     "ability": "math",                                        # optional
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}        # optional

Every row is validated once at load, so a malformed file fails before training starts, with the
file, the row number (from 1) and the offending field in the message (never deep inside a worker later).
"""

from __future__ import annotations

import re
from typing import Any

from hybrid_rl.data.bad_rows import RowError
from hybrid_rl.data.files import SUPPORTED_SUFFIXES, read_rows

__all__ = ["REQUIRED_COLUMNS", "SUPPORTED_SUFFIXES", "check_required_columns", "read_rows", "validate_row"]

REQUIRED_COLUMNS = ("data_source", "reward_model")
"""Columns every row needs besides the prompt column (``data.prompt_key``)."""
_ROW_FIX = "fix or remove the row (the row schema is in hybrid_rl/data/rows.py)"


def check_required_columns(rows: list[dict[str, Any]], *, path: str, prompt_key: str = "prompt") -> None:
    """Raise ``ValueError`` naming the file if a required column is absent from every row."""
    present = set().union(*(row.keys() for row in rows))
    for column in (prompt_key, *REQUIRED_COLUMNS):
        if column not in present:
            hint = (f"set data.prompt_key to the column holding the chat messages, or add a {column!r} column"
                    if column == prompt_key else f"add a {column!r} column")
            raise ValueError(
                f"data file {path!r} has no column {column!r} (its columns: {sorted(present)}); {hint} "
                f"(each row needs data_source, {prompt_key} = chat messages, reward_model.ground_truth)"
            )


def validate_row(row: dict[str, Any], *, path: str, row_idx: int, prompt_key: str = "prompt") -> dict[str, Any]:
    """Check one row against the schema and return it normalised (``ability``/``extra_info`` filled in).

    ``row_idx`` is the row's number inside ``path``, from 1 (in a JSON Lines file its line number);
    both are named in every error.
    """
    where = f"data file {path!r} row {row_idx}"

    def bad(field: str, problem: str) -> ValueError:
        return RowError(f"{where}: field {field!r} {problem}; {_ROW_FIX}", f"{field} {re.split(r', got| [(]', problem)[0]}")

    data_source = row.get("data_source")
    if data_source is None:
        raise bad("data_source", "is missing")
    if not isinstance(data_source, str) or not data_source:
        raise bad("data_source", f"must be a non-empty string, got {data_source!r}")
    _validate_messages(row.get(prompt_key), prompt_key, bad)
    reward_model = row.get("reward_model")
    if reward_model is None:
        raise bad("reward_model", "is missing (expected {'style': ..., 'ground_truth': ...})")
    if not isinstance(reward_model, dict):
        raise bad("reward_model", f"must be a dict with 'ground_truth', got {type(reward_model).__name__}")
    if reward_model.get("ground_truth") is None:
        raise bad("reward_model.ground_truth", "is missing")
    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise bad("extra_info", f"must be a dict, got {type(extra_info).__name__}")
    ability = row.get("ability")
    if ability is None:
        ability = "unknown"
    if not isinstance(ability, str):
        raise bad("ability", f"must be a string, got {type(ability).__name__}")
    agent_name = row.get("agent_name")
    if agent_name is not None and not isinstance(agent_name, str):
        raise bad("agent_name", f"must be a string (e.g. tool_agent, single_turn_agent), got {agent_name!r}")
    return {
        "data_source": data_source,
        "prompt": row[prompt_key],
        "ability": ability,
        "reward_model": reward_model,
        "extra_info": extra_info,
        "agent_name": agent_name,
    }


def _validate_messages(messages: Any, prompt_key: str, bad) -> None:
    if messages is None:
        raise bad(prompt_key, "is missing (expected a list of {'role', 'content'} chat messages)")
    if not isinstance(messages, list):
        raise bad(prompt_key, f"must be a list of chat messages, got {type(messages).__name__}")
    if not messages:
        raise bad(prompt_key, "is an empty message list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad(f"{prompt_key}[{i}]", f"must be a dict with 'role' and 'content', got {type(msg).__name__}")
        for key in ("role", "content"):
            if not isinstance(msg.get(key), str):
                raise bad(f"{prompt_key}[{i}].{key}", f"must be a string, got {msg.get(key)!r}")
    if not any(msg["content"].strip() for msg in messages):
        raise bad(prompt_key, "has no text (every message content is empty)")
