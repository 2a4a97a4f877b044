"""The synthetic arithmetic task: determinism, correct answers, disjoint splits, caching."""

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybrid_rl.data import RLHFDataset, ensure_arithmetic_data, generate_arithmetic
from hybrid_rl.data.arithmetic import main, normalize_ops, operand_range, sample_problems
from hybrid_rl.data.rows import validate_row
from hybrid_rl.utils.testing import build_byte_tokenizer

QUESTION = re.compile(
    r"^What is (\d+) ([-+*]) (\d+)\? Answer with just the final number after '####', like '#### 42'\.$"
)


def rows(path):
    return pq.read_table(path).to_pylist()


def parse(row):
    match = QUESTION.match(row["prompt"][0]["content"])
    assert match, row["prompt"]
    return int(match[1]), match[2], int(match[3])


def test_deterministic_for_a_seed(tmp_path):
    a = generate_arithmetic(tmp_path / "a", num_train=50, num_test=10, seed=5)
    b = generate_arithmetic(tmp_path / "b", num_train=50, num_test=10, seed=5)
    c = generate_arithmetic(tmp_path / "c", num_train=50, num_test=10, seed=6)
    assert rows(a[0]) == rows(b[0]) and rows(a[1]) == rows(b[1])
    assert rows(a[0]) != rows(c[0])


def test_answers_schema_and_disjoint_splits(tmp_path):
    train, test = generate_arithmetic(tmp_path, num_train=300, num_test=100, seed=0, max_digits=2)
    train_rows, test_rows = rows(train), rows(test)
    assert (len(train_rows), len(test_rows)) == (300, 100)
    expected = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for split, split_rows in (("train", train_rows), ("test", test_rows)):
        for i, row in enumerate(split_rows):
            validate_row(row, path=split, row_idx=i)  # the dataset's own schema check
            a, op, b = parse(row)
            assert row["reward_model"] == {"style": "rule", "ground_truth": str(expected[op](a, b))}
            assert row["data_source"] == "arithmetic" and row["prompt"][0]["role"] == "user"
            assert row["extra_info"] == {"split": split, "index": i, "a": a, "b": b, "op": op}
            assert 0 <= a <= 99 and 0 <= b <= 99
    train_q = {parse(r) for r in train_rows}
    test_q = {parse(r) for r in test_rows}
    assert len(train_q) == 300 and len(test_q) == 100 and not train_q & test_q
    assert {op for _, op, _ in train_q} == {"+", "-", "*"}
    assert any(int(r["reward_model"]["ground_truth"]) < 0 for r in train_rows)  # subtraction can go negative


def test_digit_range_and_op_subset(tmp_path):
    train, test = generate_arithmetic(tmp_path, num_train=40, num_test=5, seed=1, ops=["×"],
                                      min_digits=2, max_digits=2)
    problems = [parse(r) for r in rows(train) + rows(test)]
    assert all(op == "*" and 10 <= a <= 99 and 10 <= b <= 99 for a, op, b in problems)


def test_small_space_is_sampled_exhaustively():
    # + over one digit: exactly 100 problems; asking for all of them returns each once.
    problems = sample_problems(100, seed=0, ops=("+",), lo=0, hi=9)
    assert sorted(problems) == [(a, "+", b) for a in range(10) for b in range(10)]
    with pytest.raises(ValueError, match="asked for 101 distinct problems .* only has 100"):
        sample_problems(101, seed=0, ops=("+",), lo=0, hi=9)


def test_helpers_and_argument_errors(tmp_path):
    assert normalize_ops(["*", "−", "+", "x"]) == ("+", "-", "*")
    assert operand_range(1, 1) == (0, 9) and operand_range(2, 3) == (10, 999)
    with pytest.raises(ValueError, match="each op must be one of"):
        normalize_ops(["/"])
    with pytest.raises(ValueError, match="min_digits=3, max_digits=2"):
        operand_range(3, 2)
    with pytest.raises(ValueError, match="num_test=0"):
        generate_arithmetic(tmp_path, num_train=5, num_test=0)


def test_cli(tmp_path):
    train, test = main(["--out_dir", str(tmp_path), "--num_train", "12", "--num_test", "3",
                        "--ops", "+", "-", "--max_digits", "1", "--seed", "4"])
    assert (len(rows(train)), len(rows(test))) == (12, 3)
    assert {parse(r)[1] for r in rows(train) + rows(test)} <= {"+", "-"}
    assert rows(train) == rows(generate_arithmetic(tmp_path / "again", 12, 3, 4, ["-", "+"], 1, 1)[0])


def test_ensure_generates_once_per_params(tmp_path):
    params = dict(num_train=30, num_test=6, seed=2)
    train, test = ensure_arithmetic_data(tmp_path, **params)
    mtime = Path(train).stat().st_mtime_ns
    assert ensure_arithmetic_data(tmp_path, **params) == (train, test)
    assert Path(train).stat().st_mtime_ns == mtime  # reused, not rewritten
    assert rows(train) == rows(generate_arithmetic(tmp_path / "direct", **params)[0])
    other, _ = ensure_arithmetic_data(tmp_path, **{**params, "seed": 3})
    assert Path(other).parent != Path(train).parent
    same_ops_reordered, _ = ensure_arithmetic_data(tmp_path, **params, ops=["*", "-", "+"])
    assert same_ops_reordered == train
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # temp folders renamed or removed


def test_dataset_reads_generated_task(tmp_path):
    train, _ = generate_arithmetic(tmp_path, num_train=8, num_test=2, seed=0)
    ds = RLHFDataset(train, build_byte_tokenizer(), max_prompt_length=128)
    assert len(ds) == 8 and ds[3]["data_source"] == "arithmetic" and ds[3]["index"] == 3
