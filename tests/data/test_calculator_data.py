"""The calculator task's rows: disjoint splits, veRL tool-agent fields, the demonstration kept out of both."""

import pyarrow.parquet as pq

from hybrid_rl.data.calculator import generate_calculator
from hybrid_rl.data.rows import validate_row


def test_generate_calculator_rows(tmp_path):
    train, test = generate_calculator(tmp_path / "calc", num_train=50, num_test=20, seed=3)
    rows = {name: pq.read_table(path).to_pylist() for name, path in (("train", train), ("test", test))}
    assert (len(rows["train"]), len(rows["test"])) == (50, 20)
    problems = {name: {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in split} for name, split in rows.items()}
    assert not problems["train"] & problems["test"]
    row = rows["test"][0]
    validate_row(row, path=test, row_idx=0)
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    assert 100 <= a <= 999 and 10 <= b <= 99 and row["reward_model"]["ground_truth"] == str(a * b)
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "calculator"
    assert row["extra_info"]["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": str(a * b)}}}
    roles = [m["role"] for m in row["prompt"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    demo = row["prompt"][1]["content"]
    assert all(f"What is {x} * {y}?" != demo for split in problems.values() for x, y in split)


def test_rows_name_the_agent_loop_asked_for(tmp_path):
    _, test = generate_calculator(tmp_path / "calc", num_train=2, num_test=2, agent_name="calculator_openai")
    assert {r["agent_name"] for r in pq.read_table(test).to_pylist()} == {"calculator_openai"}
