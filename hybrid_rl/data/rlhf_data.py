"""Local data for the SFT -> reward model -> RL pipeline: SFT examples and preference pairs.

The data is made from two tasks: the synthetic ``arithmetic`` task and the real GSM8K, read as
``scripts/data/gsm8k.py`` reads it (:mod:`hybrid_rl.data.gsm8k`): ``openai/gsm8k`` with
``datasets.load_dataset(..., "main")`` (from the datasets cache after the first download;
``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` honoured), or, offline, the folder ``--gsm8k_dir`` with
``train.jsonl`` and ``test.jsonl``. For each problem:

* **SFT example**: the chat prompt the RL task uses and a correct worked solution ending in
  ``#### <answer>`` (arithmetic: ``a op b = c``; GSM8K: the reference reasoning without its
  ``<<...>>`` calculator annotations);
* **preference pairs**: chosen = that correct solution; rejected = a plausible wrong one of four
  kinds (a training problem gets one pair of each kind; a held-out problem one pair, the kinds
  cycling): ``wrong_number`` (the same reasoning, a wrong final number),
  ``truncated`` (the reasoning cut off before the answer), ``wrong_format`` (the right number
  in a form the rule scorer gives 0: ``The answer is 7.``, ``#### = 7`` or ``Answer: 7``) and
  ``wrong_arithmetic`` (a wrong result carried
  consistently into the final line, e.g. ``3 + 4 = 8`` then ``#### 8``: the mistake a policy
  actually makes, which a reward model must catch or RL against it learns nothing about correctness).
  Half of the wrong numbers are *distractors* from the prompt (an operand, the instruction's example
  ``#### 42``, a number of the GSM8K question): copying one is how a policy games a reward model
  that never saw it rejected (measured: GRPO against such a reward model learned to answer
  ``#### 42`` to everything, docs/rlhf_pipeline.md).

Rows keep ``data_source`` and ``reward_model.ground_truth``, so the rule scorer can judge what an
SFT or RL model writes on the same prompts. Files: ``sft_{train,test}.parquet`` (``prompt`` messages,
``response`` text) and ``pairs_{train,test}.parquet`` (``prompt``, ``chosen``, ``rejected``,
``rejected_kind``), the test splits disjoint from the train splits.

    python -m hybrid_rl.data.rlhf_data --task arithmetic --out_dir data/rlhf_arith
    python -m hybrid_rl.data.rlhf_data --task gsm8k --out_dir data/rlhf_gsm8k      # openai/gsm8k via datasets
    python -m hybrid_rl.data.rlhf_data --task gsm8k --gsm8k_dir path/to/gsm8k --out_dir data/rlhf_gsm8k  # offline

A bad input (a missing folder, a broken line, no ``datasets`` or no cached copy offline) ends the
command line in one line, ``rlhf_data: error: ...``, exit 2.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Iterable, Optional

from hybrid_rl.data.arithmetic import (DATA_SOURCE as ARITH_SOURCE, OPS, PROMPT_TEMPLATE, _write_parquet,
                                       operand_range, sample_problems, solve)
from hybrid_rl.data.bad_rows import BadRows
from hybrid_rl.data.files import numbered_rows
from hybrid_rl.data.gsm8k import DATA_SOURCE as GSM8K_SOURCE, INSTRUCTION as GSM8K_INSTRUCTION, hub_split, load_hub

__all__ = ["REJECTED_KINDS", "arithmetic_examples", "gsm8k_examples", "write_rlhf_data"]

REJECTED_KINDS = ("wrong_number", "truncated", "wrong_format", "wrong_arithmetic")
_ANNOTATION = re.compile(r"<<[^>]*>>")
_FINAL = re.compile(r"\n?#### *(-?[0-9.,]+)\s*$")
#: wrong_format's final lines (the right number, unscored): ``#### = N`` is what GRPO learned to write
#: against a reward model that had seen only the first form rejected (docs/rlhf_pipeline.md)
_UNSCORED_FORMS = ("The answer is {}.", "#### = {}", "Answer: {}")


def _wrong(number: str, rng: random.Random, distractors: tuple[str, ...] = ()) -> str:
    """A wrong final number: half the time one of ``distractors`` (numbers of the prompt) when
    there are any, else the answer off by a little."""
    value = int(float(number.replace(",", "")))
    candidates = [d for d in distractors if int(d) != value]  # "05" is the answer 5, not a distractor
    if candidates and rng.random() < 0.5:
        return rng.choice(candidates)
    return str(value + rng.choice([-3, -2, -1, 1, 2, 3, 10]))


def _rejected(reasoning: str, answer: str, kind: str, rng: random.Random, distractors: tuple[str, ...] = ()) -> str:
    """A plausible wrong solution of the given kind (see the module docstring)."""
    if kind == "wrong_number":
        return f"{reasoning}\n#### {_wrong(answer, rng, distractors)}".lstrip("\n")
    if kind == "wrong_arithmetic":  # the last result in the reasoning and the final line agree, both wrong
        wrong = _wrong(answer, rng, distractors)
        found = list(re.finditer(rf"(?<![\d.]){re.escape(answer)}(?![\d.])", reasoning))  # the number, not a digit of one
        if found:
            reasoning = reasoning[:found[-1].start()] + wrong + reasoning[found[-1].end():]
        return f"{reasoning}\n#### {wrong}".lstrip("\n")
    if kind == "truncated":
        lines = reasoning.splitlines()
        cut = lines[: max(1, len(lines) // 2)] if len(lines) > 1 else [reasoning[: max(1, len(reasoning) // 2)]]
        return "\n".join(cut)
    form = rng.choice(_UNSCORED_FORMS)  # the right number, in a form the rule scorer rejects
    return f"{reasoning}\n{form.format(answer)}".lstrip("\n")


def _rows(prompt: list[dict], reasoning: str, answer: str, source: str, split: str, index: int,
          rng: random.Random) -> tuple[dict, list[dict]]:
    """The SFT row of one problem and its preference pairs (every kind in training, one held out)."""
    chosen = f"{reasoning}\n#### {answer}".lstrip("\n")
    kinds = REJECTED_KINDS if split == "train" else (REJECTED_KINDS[index % len(REJECTED_KINDS)],)
    distractors = tuple(dict.fromkeys(re.findall(r"\d+", prompt[-1]["content"])))  # in order, once each
    common = {"data_source": source, "prompt": prompt, "reward_model": {"style": "rule", "ground_truth": answer},
              "extra_info": {"split": split, "index": index}}
    pairs = [{**common, "chosen": chosen, "rejected": _rejected(reasoning, answer, kind, rng, distractors),
              "rejected_kind": kind} for kind in kinds]
    return {**common, "response": chosen}, pairs


def arithmetic_examples(num_train: int, num_test: int, seed: int = 0, max_digits: int = 1):
    """``{split: (sft rows, pair rows)}`` for distinct ``a op b`` problems (test disjoint from train)."""
    lo, hi = operand_range(1, max_digits)
    problems = sample_problems(num_train + num_test, seed, OPS, lo, hi)
    rng = random.Random(seed + 1)
    out = {}
    for split, chunk in (("train", problems[num_test:]), ("test", problems[:num_test])):
        rows = [_rows([{"role": "user", "content": PROMPT_TEMPLATE.format(a=a, op=op, b=b)}],
                      f"{a} {op} {b} = {solve(a, op, b)}", str(solve(a, op, b)), ARITH_SOURCE, split, i, rng)
                for i, (a, op, b) in enumerate(chunk)]
        out[split] = ([r[0] for r in rows], [p for r in rows for p in r[1]])
    return out


def _gsm8k_lines(path: Path) -> Iterable[tuple[str, dict]]:
    """``("<file>, row <n from 1>", row)`` of a GSM8K JSONL file; a line that cannot be read, or a row
    without the question and answer, is a ValueError naming the file and the line."""
    if not path.is_file():
        raise ValueError(f"no GSM8K file {path}. Fix: --gsm8k_dir must hold train.jsonl and test.jsonl, or leave "
                         "--gsm8k_dir out to load openai/gsm8k with datasets.")
    for number, item in numbered_rows(path, BadRows(what="GSM8K rows")):
        yield f"{path}, row {number}", item


def _gsm8k_items(gsm8k_dir: Optional[str], hf_dataset: Optional[str]) -> dict[str, Iterable[tuple[str, dict]]]:
    """``{split: (where, row) pairs}`` from ``gsm8k_dir``'s JSONL files, else from the hub copy
    ``hf_dataset`` (``openai/gsm8k`` by default) loaded with ``datasets``, once for both splits."""
    if gsm8k_dir is not None and hf_dataset is not None:
        raise ValueError("give at most one of --gsm8k_dir (local JSONL folder) or --hf_dataset (hub name)")
    if gsm8k_dir is not None:
        return {split: _gsm8k_lines(Path(gsm8k_dir).expanduser() / f"{split}.jsonl") for split in ("train", "test")}
    name = hf_dataset or GSM8K_SOURCE
    dataset = load_hub(name, flag="--gsm8k_dir")
    return {split: [(f"{name}[{split}] row {i}", ex) for i, ex in enumerate(hub_split(dataset, name, split))]
            for split in ("train", "test")}


def _gsm8k_problem(where: str, item) -> tuple[str, str, str]:
    """``(question, reasoning without <<...>> annotations, final number)`` of one GSM8K row."""
    if not (isinstance(item, dict) and isinstance(item.get("question"), str) and isinstance(item.get("answer"), str)):
        columns = sorted(item) if isinstance(item, dict) else type(item).__name__
        raise ValueError(f"{where}: needs GSM8K's 'question' and 'answer' texts (columns: {columns}). Fix: give "
                         "the openai/gsm8k JSONL files.")
    match = _FINAL.search(item["answer"])
    if match is None:
        raise ValueError(f"{where}: the answer has no '#### <number>' line. Fix: give the "
                         "openai/gsm8k JSONL files (each answer ends with '#### <number>').")
    reasoning = _ANNOTATION.sub("", item["answer"][: match.start()]).strip()
    return item["question"], reasoning, match.group(1).replace(",", "")


def gsm8k_examples(gsm8k_dir: Optional[str] = None, seed: int = 0, limit: Optional[int] = None,
                   hf_dataset: Optional[str] = None):
    """``{split: (sft rows, pair rows)}`` of GSM8K (question, answer): from ``gsm8k_dir``'s
    ``train.jsonl`` / ``test.jsonl`` when it is given, else from ``openai/gsm8k`` (or ``hf_dataset``)
    with ``datasets`` (:func:`hybrid_rl.data.gsm8k.load_hub`)."""
    rng = random.Random(seed)
    out = {}
    for split, items in _gsm8k_items(gsm8k_dir, hf_dataset).items():
        rows = []
        for i, (where, item) in enumerate(items):
            if limit is not None and i >= limit:
                break
            question, reasoning, answer = _gsm8k_problem(where, item)
            prompt = [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}]
            rows.append(_rows(prompt, reasoning, answer, GSM8K_SOURCE, split, i, rng))
        out[split] = ([r[0] for r in rows], [p for r in rows for p in r[1]])
    return out


def write_rlhf_data(examples: dict, out_dir: str) -> dict[str, str]:
    """Write ``sft_{split}.parquet`` and ``pairs_{split}.parquet``; returns ``{name: path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, (sft, pairs) in examples.items():
        for name, rows in ((f"sft_{split}", sft), (f"pairs_{split}", pairs)):
            _write_parquet(rows, out / f"{name}.parquet")
            paths[name] = str(out / f"{name}.parquet")
    return paths


def main(argv=None) -> dict[str, str]:
    parser = argparse.ArgumentParser(prog="rlhf_data", description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("arithmetic", "gsm8k"), default="arithmetic")
    parser.add_argument("--out_dir", required=True)
    # the RL task's defaults and seed: the same train / held-out problem split as the default run
    parser.add_argument("--num_train", type=int, default=100, help="arithmetic: training problems")
    parser.add_argument("--num_test", type=int, default=200, help="arithmetic: held-out problems")
    parser.add_argument("--max_digits", type=int, default=1, help="arithmetic: operand digits")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--gsm8k_dir", default=None,
                        help="gsm8k, offline: folder with train.jsonl and test.jsonl (default: openai/gsm8k via datasets)")
    source.add_argument("--hf_dataset", default=None,
                        help=f"gsm8k: hub dataset read with datasets.load_dataset(NAME, 'main') (default {GSM8K_SOURCE})")
    parser.add_argument("--limit", type=int, default=None, help="gsm8k: at most this many rows per split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        examples = (arithmetic_examples(args.num_train, args.num_test, args.seed, args.max_digits)
                    if args.task == "arithmetic" else
                    gsm8k_examples(args.gsm8k_dir, args.seed, args.limit, hf_dataset=args.hf_dataset))
    except ValueError as err:  # bad input or no data source: one line, no traceback
        parser.exit(2, f"rlhf_data: error: {err}\n")
    paths = write_rlhf_data(examples, args.out_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return paths


if __name__ == "__main__":
    main()
