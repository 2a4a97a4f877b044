"""Synthetic ``arithmetic`` task: ``a op b`` with op in {+, -, *}, answered after ``####``.

Problems are drawn **without replacement** from the whole space ``ops x [lo, hi] x [lo, hi]``
(operands uniform over the integers with ``min_digits..max_digits`` digits, 0 included for one
digit), so train and test never share a problem. Rows follow veRL's schema with
``data_source="arithmetic"`` and the integer answer (possibly negative) as ``ground_truth``.
The prompt is deliberately short: the default run trains a 135M model with short responses.

CLI: ``python -m hybrid_rl.data.arithmetic --out_dir data/arith --ops + - '*' --max_digits 2``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

DATA_SOURCE = "arithmetic"
PROMPT_TEMPLATE = "What is {a} {op} {b}? Answer with just the final number after '####', like '#### 42'."
# Canonical order, so ops=("*", "+") and ("+", "*") give the same data and cache key.
OPS = ("+", "-", "*")
OP_ALIASES = {"+": "+", "-": "-", "−": "-", "*": "*", "×": "*", "x": "*"}
# Bump when the generated rows change for the same parameters (invalidates ensure_arithmetic_data caches).
GENERATOR_VERSION = 1


def normalize_ops(ops: Sequence[str]) -> tuple[str, ...]:
    """Map aliases (−, ×, x) to ``+ - *``, dedup, canonical order."""
    unknown = [op for op in ops if op not in OP_ALIASES]
    if unknown or not ops:
        raise ValueError(f"ops={list(ops)!r}: each op must be one of {sorted(OP_ALIASES)} and at least one is needed")
    chosen = {OP_ALIASES[op] for op in ops}
    return tuple(op for op in OPS if op in chosen)


def operand_range(min_digits: int, max_digits: int) -> tuple[int, int]:
    """Inclusive integer range of operands with ``min_digits..max_digits`` digits."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got min_digits={min_digits}, max_digits={max_digits}")
    lo = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return lo, 10 ** max_digits - 1


def solve(a: int, op: str, b: int) -> int:
    """The exact integer answer of ``a op b``."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown op {op!r}; valid: {OPS}")


def make_row(a: int, op: str, b: int, split: str, index: int) -> dict:
    """One veRL-schema row for ``a op b``."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(a=a, op=op, b=b)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(solve(a, op, b))},
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "op": op},
    }


def sample_problems(num: int, seed: int, ops: tuple[str, ...], lo: int, hi: int) -> list[tuple[int, str, int]]:
    """``num`` distinct problems, seeded: a sample without replacement of indices into the space."""
    width = hi - lo + 1
    space = len(ops) * width * width
    if num > space:
        raise ValueError(
            f"asked for {num} distinct problems but ops={list(ops)} over operands {lo}..{hi} only has {space}; "
            f"lower num_train/num_test or raise max_digits"
        )
    problems = []
    for idx in random.Random(seed).sample(range(space), num):
        idx, op_idx = divmod(idx, len(ops))
        b_off, a_off = divmod(idx, width)
        problems.append((lo + a_off, ops[op_idx], lo + b_off))
    return problems


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)  # readers never see a half-written file


def generate_arithmetic(out_dir: str | os.PathLike, num_train: int = 10000, num_test: int = 500, seed: int = 0,
                        ops: Sequence[str] = OPS, min_digits: int = 1, max_digits: int = 2) -> tuple[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; return their paths."""
    if num_train < 1 or num_test < 1:
        raise ValueError(f"need num_train >= 1 and num_test >= 1, got num_train={num_train}, num_test={num_test}")
    ops = normalize_ops(ops)
    lo, hi = operand_range(min_digits, max_digits)
    problems = sample_problems(num_train + num_test, seed, ops, lo, hi)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, chunk in (("train", problems[num_test:]), ("test", problems[:num_test])):
        rows = [make_row(a, op, b, split, i) for i, (a, op, b) in enumerate(chunk)]
        path = out / f"{split}.parquet"
        _write_parquet(rows, path)
        paths.append(str(path))
    logger.info("wrote %d train / %d test arithmetic problems to %s", num_train, num_test, out)
    return paths[0], paths[1]


def ensure_arithmetic_data(cache_dir: str | os.PathLike, *, num_train: int = 10000, num_test: int = 500,
                           seed: int = 0, ops: Sequence[str] = OPS, min_digits: int = 1,
                           max_digits: int = 2) -> tuple[str, str]:
    """Generate the task once into ``cache_dir/arithmetic-<hash of params>/`` and return the paths.

    Generation happens in a temporary folder renamed into place, so concurrent callers (several
    runs, several Ray workers) never read a partial dataset.
    """
    params = {"num_train": num_train, "num_test": num_test, "seed": seed, "ops": list(normalize_ops(ops)),
              "min_digits": min_digits, "max_digits": max_digits, "version": GENERATOR_VERSION}
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    cache_dir = Path(cache_dir)
    final = cache_dir / f"arithmetic-{key}"
    train, test = final / "train.parquet", final / "test.parquet"
    if (final / "params.json").is_file():  # written last, so its presence means complete
        return str(train), str(test)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".arithmetic-{key}-", dir=cache_dir))
    try:
        generate_arithmetic(tmp, **{k: v for k, v in params.items() if k != "version"})
        (tmp / "params.json").write_text(json.dumps(params, indent=2))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "params.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(train), str(test)


def main(argv: Sequence[str] | None = None) -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, help="folder for train.parquet / test.parquet")
    parser.add_argument("--num_train", type=int, default=10000)
    parser.add_argument("--num_test", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", nargs="+", default=list(OPS), help="any of + - * (aliases − × x)")
    parser.add_argument("--min_digits", type=int, default=1)
    parser.add_argument("--max_digits", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return generate_arithmetic(args.out_dir, args.num_train, args.num_test, args.seed, args.ops,
                               args.min_digits, args.max_digits)


if __name__ == "__main__":
    main()
