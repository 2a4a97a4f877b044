"""GSM8K as veRL's ``examples/data_preprocess/gsm8k.py`` reads and converts it: one loader for
``scripts/data/gsm8k.py`` (veRL parquet) and ``python -m hybrid_rl.data.rlhf_data --task gsm8k`` (SFT
examples and preference pairs).

The rows come from a local folder when one is given (the offline path: ``train.jsonl`` and
``test.jsonl``, ``question``/``answer`` per line, as in openai/grade-school-math), else from
``datasets.load_dataset("openai/gsm8k", "main")`` (another hub copy by name), downloaded once into the
datasets cache (``HF_DATASETS_CACHE``) and read from there afterwards, also with ``HF_DATASETS_OFFLINE=1``
/ ``HF_HUB_OFFLINE=1``. Every failure is a one-line ``ValueError`` naming the fix.

Converted rows have veRL's semantics: the question is followed by :data:`INSTRUCTION`,
``data_source="openai/gsm8k"``, the ground truth is the number after ``####`` in the reference answer
(commas removed), and ``extra_info`` keeps split/index/answer/question. :func:`tool_agent_row` and
:func:`verl_tool_row` make the rows of the multi-turn tool rollouts (see ``scripts/data/gsm8k.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
_ANSWER_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
TOOL_SYSTEM_PROMPT = (
    "You are a math expert. Solve the question step by step. For arithmetic, call the calculator: "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> and wait for the '
    "result. Put your final answer in the format of `#### <answer>`."
)


VERL_TOOL_SYSTEM_PROMPT = (
    "You are a math expert. Solve the question step by step, reasoning before any tool call. Once you "
    "have an answer, check it at least once with the `calc_gsm8k_reward` tool: "
    '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "<number>"}}</tool_call>, and refine '
    "it if needed. Put your final answer in the format of `#### <answer>`."
)


def extract_solution(answer: str) -> str | None:
    """The number after ``#### `` with thousands separators removed, or None when absent."""
    match = _ANSWER_RE.search(answer)
    return match.group(1).replace(",", "") if match else None


def _tool_row(row: dict, system_prompt: str, tool: str) -> dict:
    """``row`` for the multi-turn tool loop: ``system_prompt`` first, ``agent_name: tool_agent`` and the
    ground truth as ``tool``'s ``create_kwargs``."""
    truth = row["reward_model"]["ground_truth"]
    return {**row, "agent_name": "tool_agent",
            "prompt": [{"role": "system", "content": system_prompt}, *row["prompt"]],
            "extra_info": {**row["extra_info"], "need_tools_kwargs": True,
                           "tools_kwargs": {tool: {"create_kwargs": {"ground_truth": truth}}}}}


def tool_agent_row(row: dict) -> dict:
    """The row for the multi-turn rollout with the ``calculator`` tool (see the module docstring)."""
    return _tool_row(row, TOOL_SYSTEM_PROMPT, "calculator")


def verl_tool_row(row: dict) -> dict:
    """The row for veRL's ``calc_gsm8k_reward`` tool (see the module docstring)."""
    return _tool_row(row, VERL_TOOL_SYSTEM_PROMPT, "calc_gsm8k_reward")


def make_row(question: str, answer: str, split: str, index: int, where: str) -> dict:
    """One veRL-schema row; ``where`` (file and line) is named in the error for a malformed example."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: field 'question' is missing or not a non-empty string")
    if not isinstance(answer, str):
        raise ValueError(f"{where}: field 'answer' is missing or not a string")
    solution = extract_solution(answer)
    if solution is None:
        raise ValueError(f"{where}: field 'answer' has no final '#### <number>' line")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def rows_from_jsonl(path: Path, split: str) -> list[dict]:
    """Rows of one GSM8K JSONL file (``question``/``answer`` per line)."""
    if not path.is_file():
        raise ValueError(f"GSM8K file {str(path)!r} not found; --input_dir must hold {split}.jsonl")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            try:
                example = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: invalid JSON ({err})") from err
            if not isinstance(example, dict):
                raise ValueError(f"{where}: expected a JSON object with 'question' and 'answer'")
            rows.append(make_row(example.get("question"), example.get("answer"), split, len(rows), where))
    if not rows:
        raise ValueError(f"GSM8K file {str(path)!r} has no rows")
    return rows


OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
"""Set to 1, these keep ``datasets`` off the network (only a cached copy is read); as in ``datasets``,
``HF_DATASETS_OFFLINE`` decides when it is set, else ``HF_HUB_OFFLINE``."""


def hub_offline() -> str | None:
    """``"VAR=value"`` of the variable that keeps ``datasets`` offline here, or None when it may download."""
    var = next((v for v in OFFLINE_ENV if os.environ.get(v) is not None), None)
    on = var is not None and os.environ[var].strip().upper() in ("1", "ON", "YES", "TRUE")
    return f"{var}={os.environ[var]}" if on else None


def load_hub(name: str = DATA_SOURCE, flag: str = "--input_dir"):
    """``datasets.load_dataset(name, "main")`` as veRL's script loads it (from the datasets cache after
    the first download); a ValueError with the fix when ``datasets`` is missing or the copy cannot be had.
    ``flag`` is the caller's option for a local folder, named in the fix."""
    local = f"{flag} <folder with train.jsonl and test.jsonl>"
    try:
        import datasets
    except ImportError as err:
        raise ValueError(f"reading {name!r} from the hub needs the 'datasets' package ({err}). Fix: pip install "
                         f"datasets, or pass {local}") from err
    try:
        return datasets.load_dataset(name, "main")
    except Exception as err:  # offline, not cached, unknown name...: the hub raises many types
        offline = hub_offline()
        why = (f"it is not in the datasets cache and {offline} forbids the download" if offline
               else "the download failed")
        detail = " ".join(str(err).split())[:200]
        raise ValueError(f"could not load {name!r} ('main') with datasets: {why} ({type(err).__name__}: {detail}). "
                         f"Fix: pass {local} (offline), or run once with network access to fill the datasets "
                         "cache") from err


def hub_split(dataset, name: str, split: str):
    """``dataset[split]`` of a loaded hub dataset (it iterates question/answer dicts); a ValueError with
    the fix when the copy has no such split."""
    try:
        return dataset[split]
    except KeyError as err:
        raise ValueError(f"{name!r} has no split {split!r}. Fix: use a copy with train and test splits") from err


def rows_from_hub(dataset, name: str, split: str) -> list[dict]:
    """Rows of one split of a loaded hub dataset (see :func:`hub_split`)."""
    return [make_row(ex.get("question"), ex.get("answer"), split, i, f"{name}[{split}] row {i}")
            for i, ex in enumerate(hub_split(dataset, name, split))]


def read_splits(splits: Iterable[str] = SPLITS, *, input_dir: str | os.PathLike | None = None,
                hf_dataset: str | None = None) -> dict[str, list[dict]]:
    """``{split: rows}`` from ``input_dir``'s ``<split>.jsonl`` files when it is given, else from the hub
    dataset ``hf_dataset`` (``openai/gsm8k`` by default), loaded once for all splits."""
    if input_dir is not None and hf_dataset is not None:
        raise ValueError("give at most one of --input_dir (local JSONL folder) or --hf_dataset (hub name)")
    if input_dir is not None:
        if not Path(input_dir).expanduser().is_dir():
            raise ValueError(f"--input_dir {str(input_dir)!r} is not a folder. Fix: pass the folder that holds "
                             "train.jsonl and test.jsonl, or leave --input_dir out to load openai/gsm8k with datasets")
        folder = Path(input_dir).expanduser()
        return {split: rows_from_jsonl(folder / f"{split}.jsonl", split) for split in splits}
    name = hf_dataset or DATA_SOURCE
    dataset = load_hub(name)
    return {split: rows_from_hub(dataset, name, split) for split in splits}


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def convert(output_dir: str | os.PathLike, *, input_dir: str | os.PathLike | None = None,
            hf_dataset: str | None = None, splits: Iterable[str] = SPLITS,
            tool_agent: bool = False, verl_tool: bool = False) -> dict[str, str]:
    """Write ``<split>.parquet`` for each split into ``output_dir``; return {split: path}. The rows come
    from :func:`read_splits` (``input_dir``, else the hub). ``tool_agent``: rows for the multi-turn
    calculator rollout (:func:`tool_agent_row`); ``verl_tool``: rows for veRL's answer-checking tool
    (:func:`verl_tool_row`)."""
    if tool_agent and verl_tool:
        raise ValueError("give at most one of --tool_agent (calculator rows) and --verl_tool (calc_gsm8k_reward rows)")
    by_split = read_splits(splits, input_dir=input_dir, hf_dataset=hf_dataset)
    out = Path(output_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in by_split.items():
        if tool_agent or verl_tool:
            rows = [(tool_agent_row if tool_agent else verl_tool_row)(r) for r in rows]
        paths[split] = str(out / f"{split}.parquet")
        write_parquet(rows, Path(paths[split]))
        logger.info("%s: %d rows -> %s", split, len(rows), paths[split])
    return paths
