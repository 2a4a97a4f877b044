"""Online DPO end to end through Ray: the tiny model, 2 data-parallel workers, 2 steps, the batch
checked at every step boundary (tests/conftest.py sets HYBRID_RL_CHECK_BATCH=1)."""

import math
import textwrap

import pytest
import torch
from test_e2e import _assert_ok, _rows, _run_cli, _weights

pytestmark = pytest.mark.slow


def test_online_dpo_two_workers(tmp_path, tiny_model_dir):
    reward = tmp_path / "length.py"  # a random model answers no sum: score by length so pairs have a preference
    reward.write_text(textwrap.dedent('''
        def length(data_source, solution_str, ground_truth, extra_info=None):
            return len(solution_str) / 10.0
    '''))
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, "actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}",
                        f"custom_reward_function.path={reward}", "custom_reward_function.name=length",
                        "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=2",
                        "trainer.val_before_train=false",
                        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=float32"))  # as the actor's
    run = tmp_path / "run"
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        pairs = row["online_dpo/pairs"]
        assert pairs % 2 == 0  # trimmed to whole pairs per worker
        assert pairs + row["online_dpo/trimmed_pairs"] + row["online_dpo/tie_groups"] == 4  # 4 prompts of 4 answers
        assert row["online_dpo/update_skipped"] == float(pairs == 0)
        assert "critic/advantages/mean" not in row and "actor/pg_loss" not in row
        assert row["critic/score/mean"] > 0 and "timing_s/build_pairs" in row
    first = rows[0]
    if first["online_dpo/pairs"]:
        # step 1: the policy is the reference, so every pair's implicit reward margin is 0: loss ln 2
        assert math.isclose(first["dpo/loss"], math.log(2), abs_tol=1e-3)
        assert first["dpo/rewards/margins"] == pytest.approx(0.0, abs=1e-3)
    assert sum(r["online_dpo/pairs"] for r in rows) > 0
    before, after = _weights(run / "global_step_1"), _weights(run / "global_step_2")
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    assert changed == bool(rows[1]["online_dpo/pairs"])  # step 2 trained iff it had pairs
