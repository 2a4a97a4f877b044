"""Small writers and a hand byte->id rule for the data tests."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

IM_START, IM_END, PAD = 1, 2, 0


def byte_ids(text: str) -> list[int]:
    """Ids of the byte tokenizer for ASCII text, by hand: printable chars are ``ord - 30``
    (GPT-2 byte alphabet sorted, after 3 special tokens), newline 201, space 223."""
    special = {"\n": 201, " ": 223}
    return [special[c] if c in special else ord(c) - 30 for c in text]


def chatml_ids(content: str, role: str = "user") -> list[int]:
    """Ids of a one-message ChatML prompt with the assistant generation prompt."""
    return ([IM_START] + byte_ids(f"{role}\n{content}") + [IM_END] + byte_ids("\n")
            + [IM_START] + byte_ids("assistant\n"))


def make_row(content: str, truth: str = "1", source: str = "toy", **extra) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": dict(extra) if extra else None,  # parquet cannot store an empty struct
    }


def write_parquet(rows, path) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(rows, path) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)
