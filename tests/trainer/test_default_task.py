"""Demonstration prompts of the default arithmetic task."""

from hybrid_rl.data import read_rows
from hybrid_rl.trainer.config import ArithmeticDataConfig
from hybrid_rl.trainer.core.default_task import add_demonstrations, ensure_default_task


def _row(a, op, b, answer, split="train"):
    return {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{a}{op}{b}?"}],
            "reward_model": {"ground_truth": str(answer)}, "extra_info": {"a": a, "b": b, "op": op, "split": split}}


def test_demonstrations_come_from_train_and_match_the_operation():
    train = [_row(1, "+", 2, 3), _row(2, "*", 3, 6), _row(4, "+", 4, 8), _row(5, "-", 1, 4)]
    test = [_row(7, "+", 1, 8, "test"), _row(3, "*", 3, 9, "test"), _row(9, "-", 9, 0, "test")]
    new_train, new_test = add_demonstrations(train, test, num_shots=1)
    assert [r["extra_info"]["a"] for r in new_train] == [4]  # 1+2, 2*3, 5-1 became demonstrations
    assert new_test[0]["prompt"] == [
        {"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "1 + 2 = 3\n#### 3"},
        {"role": "user", "content": "7+1?"},
    ]
    assert new_test[1]["prompt"][1]["content"] == "2 * 3 = 6\n#### 6"
    assert new_test[2]["prompt"][1]["content"] == "5 - 1 = 4\n#### 4"
    assert add_demonstrations(train, test, 0) == (train, test)


def test_ensure_default_task_files(tmp_path):
    cfg = ArithmeticDataConfig(cache_dir=str(tmp_path), num_train=30, num_test=20, max_digits=1, num_shots=1)
    train, test = ensure_default_task(cfg)
    train_rows, test_rows = read_rows(train), read_rows(test)
    assert len(train_rows) == 27 and len(test_rows) == 20  # one demonstration per op removed from train
    shown = {t["content"] for r in test_rows for t in r["prompt"][:-1] if t["role"] == "user"}
    asked = {r["prompt"][-1]["content"] for r in test_rows}
    assert not shown & asked  # no test problem appears as a demonstration
    assert ensure_default_task(cfg) == (train, test)  # cached
    bare = ensure_default_task(ArithmeticDataConfig(cache_dir=str(tmp_path), num_train=30, num_test=20,
                                                    max_digits=1, num_shots=0))
    assert len(read_rows(bare[0])) == 30
