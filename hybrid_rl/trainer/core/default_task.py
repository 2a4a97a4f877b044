"""The default run's task: the synthetic arithmetic set, optionally with solved demonstrations.

Why demonstrations: asked zero-shot for "the final number after '####'", the embedded
SmolLM2-135M-Instruct copies the example answer ("#### 42") or omits the marker, so no sampled
response earns a reward and GRPO has nothing to learn from (measured: 0 of 512 samples on 1-digit
problems). One solved example of the same operation as an earlier chat turn
(``"3 + 4 = 7\\n#### 7"``) makes it follow the format often enough to give a learning signal.

The problems come from :func:`hybrid_rl.data.ensure_arithmetic_data`; the demonstrations are taken
from the *training* split (the first problem of each operation, then removed from training), so
the held-out test set never contains a problem shown in the prompt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hybrid_rl.trainer.config import ArithmeticDataConfig


def _demo_turns(row: dict) -> list[dict[str, str]]:
    info = row["extra_info"]
    answer = row["reward_model"]["ground_truth"]
    return [
        row["prompt"][-1],
        {"role": "assistant", "content": f"{info['a']} {info['op']} {info['b']} = {answer}\n#### {answer}"},
    ]


def add_demonstrations(train_rows: list[dict], test_rows: list[dict], num_shots: int) -> tuple[list[dict], list[dict]]:
    """Prefix every prompt with ``num_shots`` solved training problems of the same operation.

    Returns new (train, test) rows; the training rows used as demonstrations are removed.
    """
    if num_shots <= 0:
        return train_rows, test_rows
    demos: dict[str, list[dict]] = {}
    used = set()
    for i, row in enumerate(train_rows):
        op = row["extra_info"]["op"]
        if len(demos.setdefault(op, [])) < num_shots:
            demos[op].append(row)
            used.add(i)

    def with_demos(row: dict) -> dict:
        turns = [t for demo in demos.get(row["extra_info"]["op"], []) for t in _demo_turns(demo)]
        return {**row, "prompt": turns + list(row["prompt"])}

    train = [with_demos(r) for i, r in enumerate(train_rows) if i not in used]
    return train, [with_demos(r) for r in test_rows]


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)  # concurrent runs never read a half-written file


def ensure_default_task(cfg: ArithmeticDataConfig) -> tuple[str, str]:
    """(train, test) parquet paths of the arithmetic task with ``cfg.num_shots`` demonstrations."""
    from hybrid_rl.data import ensure_arithmetic_data, read_rows

    train, test = ensure_arithmetic_data(
        os.path.expanduser(cfg.cache_dir), num_train=cfg.num_train, num_test=cfg.num_test, seed=cfg.seed,
        ops=list(cfg.ops), min_digits=cfg.min_digits, max_digits=cfg.max_digits,
    )
    if cfg.num_shots <= 0:
        return train, test
    folder = Path(train).parent
    out_train, out_test = folder / f"train_{cfg.num_shots}shot.parquet", folder / f"test_{cfg.num_shots}shot.parquet"
    if not (out_train.is_file() and out_test.is_file()):
        new_train, new_test = add_demonstrations(read_rows(train), read_rows(test), cfg.num_shots)
        _write_parquet(new_train, out_train)
        _write_parquet(new_test, out_test)
        (folder / f"{cfg.num_shots}shot.json").write_text(json.dumps({"num_shots": cfg.num_shots}))
    return str(out_train), str(out_test)


SUPERVISED_FILES = {"sft": ("sft_train", "sft_test"), "pairs": ("pairs_train", "pairs_test")}
"""The supervised modes' default files: SFT examples and preference pairs of the same problems."""


def ensure_supervised_task(cfg: ArithmeticDataConfig, kind: str) -> tuple[str, str]:
    """(train, test) parquet paths of the arithmetic task's SFT examples (``kind="sft"``) or
    preference pairs (``"pairs"``), generated once into ``cfg.cache_dir`` (the RL task's split)."""
    from hybrid_rl.data.rlhf_data import REJECTED_KINDS, arithmetic_examples, write_rlhf_data

    # v3: every kind per training problem, distractors, unscored forms
    version = f"{cfg.num_train}-{cfg.num_test}-{cfg.seed}-{cfg.max_digits}-k{len(REJECTED_KINDS)}-v3"
    folder = os.path.join(os.path.expanduser(cfg.cache_dir), f"rlhf-{version}")
    train, test = (os.path.join(folder, f"{name}.parquet") for name in SUPERVISED_FILES[kind])
    if not (os.path.isfile(train) and os.path.isfile(test)):
        write_rlhf_data(arithmetic_examples(cfg.num_train, cfg.num_test, cfg.seed, cfg.max_digits), folder)
    return train, test


def supervised_data_files(data: Any, kind: str) -> tuple[list[str], list[str]]:
    """(train files, held-out files) of a supervised mode's ``data`` section; no ``train_files`` =
    the arithmetic task's (:func:`ensure_supervised_task`)."""
    from hybrid_rl.trainer.config.run_checks import as_file_list

    if data.train_files is None:
        train, test = ensure_supervised_task(data.arithmetic, kind)
        return [train], [test]
    return as_file_list(data.train_files), as_file_list(data.val_files)
