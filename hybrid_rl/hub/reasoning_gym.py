"""reasoning-gym's procedural tasks as rows and its own ``score_answer`` as the reward, unchanged.

Any dataset of ``reasoning_gym.factory.DATASETS`` with its own config: entries are drawn with
``reasoning_gym.create_dataset(name, seed=seed, size=..., **config)`` by index, duplicates (same
question) skipped, the first ``test_size`` distinct entries held out as ``test.parquet`` and the next
``size`` as ``train.parquet``, so the splits never share a question. Rows follow veRL's schema:

- ``prompt``: the entry's question plus one line asking for the final answer between ``<answer>``
  and ``</answer>``, as chat messages, after ``num_shots`` solved training entries (a user turn and
  an assistant turn ``<answer>{answer}</answer>`` each; those entries are removed from training);
- ``data_source``: ``reasoning_gym/<name>``, which the reward registry routes here by prefix;
- ``reward_model.ground_truth``: JSON of ``{"dataset", "config", "entry"}`` with the whole entry
  (question, answer, metadata), so a row is scored from itself alone, whatever the seed or index;
- ``extra_info``: split, index, seed, dataset and the entry's index in the seeded dataset.

The reward (:func:`compute_score`) extracts the **last** ``<answer>...</answer>`` of the response
(reasoning-gym's own ``utils.extract_answer``: inner text, whitespace stripped) and returns the
dataset's ``score_answer(answer, entry)`` as ``score`` (1.0 exact; some tasks give partial credit) and
``acc`` (1.0 for a full score only). A response without the tags, or one that makes ``score_answer``
raise, scores 0.0.

CLI: ``python -m hybrid_rl.hub.reasoning_gym --dataset basic_arithmetic --out_dir data/rg
--config min_terms=2 --config max_terms=2``; config values are JSON (``operators='["+","-"]'``) or
plain strings.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["DATA_SOURCE_PREFIX", "ReasoningGymDataConfig", "compute_score", "extract_response_answer",
           "generate", "main", "make_rows", "parse_config_items"]

DATA_SOURCE_PREFIX = "reasoning_gym/"
ANSWER_INSTRUCTION = "Give only the final answer between <answer> and </answer>."
# Indices scanned per distinct entry wanted before giving up (small task spaces repeat questions).
_SCAN_FACTOR = 4
_INSTALL_HINT = "reasoning-gym is not installed; install the optional environments with `pip install -e .[envs]`"


@dataclasses.dataclass(kw_only=True)
class ReasoningGymDataConfig:
    """What :func:`generate` writes."""

    dataset: str
    """A reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``), e.g. ``basic_arithmetic``."""
    out_dir: str
    """Folder for ``train.parquet`` and ``test.parquet``."""
    size: int = 1000
    """Training rows (distinct questions)."""
    test_size: int = 200
    """Held-out rows (distinct questions, none of them in training)."""
    seed: int = 0
    """The reasoning-gym dataset seed: the same seed and config give the same rows."""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The dataset's own config fields (its ``*Config`` dataclass), e.g. ``{"max_terms": 2}``."""
    num_shots: int = 1
    """Solved training entries shown before each question (0: the bare question)."""

    def __post_init__(self) -> None:
        if self.size < 1 or self.test_size < 1:
            raise ValueError(f"need size >= 1 and test_size >= 1, got size={self.size}, test_size={self.test_size}")
        if not 0 <= self.num_shots < self.size:
            raise ValueError(f"num_shots={self.num_shots} must be >= 0 and below size={self.size} (the demonstrations "
                             f"come from the training split); use 0 or 1")
        for key in ("seed", "size"):
            if key in self.config:
                raise ValueError(f"config key {key!r} is set by this tool; pass --{key} instead of --config {key}=...")


def _library():
    """The ``reasoning_gym`` module, or ImportError with the install command."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return reasoning_gym


def check_dataset_name(name: str) -> None:
    """ValueError naming where the valid names live and the closest ones, unless ``name`` is one."""
    names = sorted(_library().factory.DATASETS)
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f"did you mean {close}? " if close else ""
        raise ValueError(f"unknown reasoning-gym dataset {name!r}: {hint}valid names are the {len(names)} keys of "
                         f"reasoning_gym.factory.DATASETS (e.g. basic_arithmetic, leg_counting); pick one of them")


def make_dataset(name: str, config: dict[str, Any], *, seed: int = 0, size: int = 1):
    """``reasoning_gym.create_dataset(name, seed=, size=, **config)`` with one-line errors for bad input."""
    check_dataset_name(name)
    library = _library()
    try:
        return library.create_dataset(name, seed=seed, size=size, **config)
    except (TypeError, AssertionError, ValueError) as exc:  # unknown field / the config's own validate()
        config_cls = library.factory.DATASETS[name][1]
        fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
        reason = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise ValueError(f"reasoning-gym dataset {name!r} rejected config {config}: {type(exc).__name__}: "
                         f"{reason}; its config fields are {fields}") from exc


def parse_config_items(items: Sequence[str]) -> dict[str, Any]:
    """``["max_terms=2", 'operators=["+","-"]', "style=simple"]`` -> a dict; values are JSON or strings."""
    config: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--config {item!r} is not key=value; write e.g. --config max_terms=2")
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value  # a plain string such as format_style=simple
    return config


def _jsonable(value: Any) -> Any:
    """json.dumps fallback for numpy scalars and sets found in some tasks' metadata."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def distinct_entries(cfg: ReasoningGymDataConfig) -> list[tuple[int, dict]]:
    """``test_size + size`` ``(index, entry)`` pairs with distinct questions, in index order."""
    wanted = cfg.size + cfg.test_size
    limit = _SCAN_FACTOR * wanted + 100
    dataset = make_dataset(cfg.dataset, cfg.config, seed=cfg.seed, size=limit)
    seen: set[str] = set()
    chosen: list[tuple[int, dict]] = []
    for index in range(limit):
        entry = dataset[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            chosen.append((index, entry))
            if len(chosen) == wanted:
                return chosen
    raise ValueError(f"reasoning-gym dataset {cfg.dataset!r} with config {cfg.config} gave only {len(chosen)} distinct "
                     f"questions in {limit} draws, fewer than size + test_size = {wanted}; lower --size/--test_size or "
                     f"widen the config")


def _user_turn(question: str) -> dict[str, str]:
    return {"role": "user", "content": f"{question.rstrip()}\n\n{ANSWER_INSTRUCTION}"}


def make_rows(cfg: ReasoningGymDataConfig, entries: Sequence[tuple[int, dict]], split: str,
              demos: Sequence[dict] = ()) -> list[dict]:
    """veRL-schema rows for ``(dataset index, entry)`` pairs, each after the ``demos`` turns."""
    shots = []
    for demo in demos:
        shots += [_user_turn(demo["question"]), {"role": "assistant", "content": f"<answer>{demo['answer']}</answer>"}]
    rows = []
    for i, (index, entry) in enumerate(entries):
        truth = {"dataset": cfg.dataset, "config": cfg.config,
                 "entry": {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}}
        rows.append({
            "data_source": DATA_SOURCE_PREFIX + cfg.dataset,
            "prompt": shots + [_user_turn(entry["question"])],
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth, default=_jsonable)},
            "extra_info": {"split": split, "index": i, "dataset": cfg.dataset, "seed": cfg.seed,
                           "dataset_index": index},
        })
    return rows


def _check_oracle(rows: Sequence[dict]) -> None:
    """Log how many stored entries do not give their own answer a full score once reloaded from JSON
    (a task whose metadata does not survive JSON, or with several valid answers)."""
    misses = 0
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        oracle = json.loads(truth)["entry"]["answer"]
        misses += _score(row["data_source"], f"<answer>{oracle}</answer>", truth) < 1.0
    if misses:
        logger.warning("%d of %d rows do not score 1.0 with their own answer after a JSON round trip",
                       misses, len(rows))


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)  # readers never see a half-written file


def generate(cfg: ReasoningGymDataConfig) -> tuple[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``cfg.out_dir``; return their paths."""
    entries = distinct_entries(cfg)
    test, train = entries[:cfg.test_size], entries[cfg.test_size:]
    demos = [entry for _, entry in train[:cfg.num_shots]]
    splits = {"train": make_rows(cfg, train[cfg.num_shots:], "train", demos),
              "test": make_rows(cfg, test, "test", demos)}
    _check_oracle(splits["test"])
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        _write_parquet(rows, out / f"{split}.parquet")
    logger.info("wrote %d train / %d test rows of reasoning_gym/%s to %s", len(splits["train"]), len(splits["test"]),
                cfg.dataset, out)
    return str(out / "train.parquet"), str(out / "test.parquet")


@functools.lru_cache(maxsize=64)
def _scorer(name: str, config_json: str):
    """One dataset instance per (name, config): its ``score_answer`` may read the config."""
    return make_dataset(name, json.loads(config_json)).score_answer


def extract_response_answer(solution_str: Any) -> str | None:
    """The inner text of the last ``<answer>...</answer>`` (stripped), or None."""
    if not isinstance(solution_str, str):
        return None
    return _library().utils.extract_answer(solution_str, tag_name="answer", strip=True)


def _score(data_source: str, solution_str: Any, ground_truth: Any) -> float:
    try:
        truth = json.loads(ground_truth)
        name, config, entry = truth["dataset"], truth["config"], truth["entry"]
    except (TypeError, ValueError, KeyError) as exc:  # the row is broken, not the model's answer
        raise ValueError(f"data_source {data_source!r}: reward_model.ground_truth is not this adapter's JSON "
                         f"({type(exc).__name__}); regenerate the rows with "
                         f"python -m hybrid_rl.hub.reasoning_gym") from exc
    score_answer = _scorer(name, json.dumps(config, sort_keys=True))
    answer = extract_response_answer(solution_str)
    if answer is None:
        return 0.0
    try:
        score = float(score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - the task's scorer choking on untrusted model text scores 0
        logger.debug("reasoning-gym %s score_answer raised on %r", name, answer[:80], exc_info=True)
        return 0.0
    return score if math.isfinite(score) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """The reward of a ``reasoning_gym/<name>`` row: ``score`` is the dataset's ``score_answer`` on the
    response's last ``<answer>...</answer>`` (0.0 without one or when ``score_answer`` raises); ``acc`` is
    1.0 for a full score only (some tasks give partial credit), logged as ``val-core/<source>/acc/...``."""
    score = _score(data_source, solution_str, ground_truth)
    return {"score": score, "acc": 1.0 if score == 1.0 else 0.0}


def warmup() -> None:
    """Import reasoning-gym once (~1 s) in this process, before scoring forks its children."""
    _library()


def main(argv: Sequence[str] | None = None) -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a name in reasoning_gym.factory.DATASETS")
    parser.add_argument("--out_dir", required=True, help="folder for train.parquet / test.parquet")
    parser.add_argument("--size", type=int, default=1000, help="training rows")
    parser.add_argument("--test_size", type=int, default=200, help="held-out rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_shots", type=int, default=1, help="solved training entries before each question")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of the dataset's config (repeatable); the value is JSON or a string")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return generate(ReasoningGymDataConfig(dataset=args.dataset, out_dir=args.out_dir, size=args.size,
                                               test_size=args.test_size, seed=args.seed, num_shots=args.num_shots,
                                               config=parse_config_items(args.config)))
    except (ValueError, ImportError) as exc:  # bad input: its one line, no traceback
        raise SystemExit(f"error: {exc}") from exc


if __name__ == "__main__":
    main()
