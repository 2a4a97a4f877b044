"""Partial rollout end to end with environment rows (``async_training.partial_rollout=true`` and the guess-the-number
environment through ``EnvAgentLoop``) on the tiny model: each row streams as its own episode, groups enter the SQL
buffer in the trajectory layout, and every buffered row keeps per-token versions on model tokens (-1 on the
environment's observations) and behaviour log-probs."""

import subprocess
import sys

import pytest

from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli
from tests.trainer.test_e2e_agent import chatty_model_dir  # noqa: F401 - a fixture: ends turns with EOS often
from tests.trainer.test_e2e_async import DECOUPLED_LOSS, _async_args, _buffer_rows, _reward_args

pytestmark = pytest.mark.slow


def test_environment_rows_stream_with_partial_rollout(tmp_path, chatty_model_dir):
    from tests.trainer.test_e2e import REPO

    data = tmp_path / "guess_number"
    subprocess.run([sys.executable, "-m", "hybrid_rl.data.guess_number", "--out_dir", str(data), "--num_train", "16",
                    "--num_test", "2"], check=True, capture_output=True)
    args = [*_reward_args(tmp_path),
            *_async_args("async_training.buffer.storage_type=sql", "async_training.partial_rollout=true",
                         "async_training.max_head_offpolicyness=1", *DECOUPLED_LOSS),
            f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
            "data.max_prompt_length=640", "data.max_response_length=160", "actor_rollout_ref.rollout.temperature=1.0",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={REPO}/recipes/guess_number_env/agents.yaml",
            "trainer.total_training_steps=2", "trainer.save_freq=-1"]
    _assert_ok(_run_cli(tmp_path, chatty_model_dir, *args))
    logged = _rows(tmp_path / "run")
    assert logged[-1]["training/global_step"] == 2 and all(r["async/staleness_max"] <= 1 for r in logged)
    rows = _buffer_rows(tmp_path / "run")
    assert sum(e.status == "taken" for e in rows) == 2 * 8
    observed = 0
    for e in rows:
        # stored only where the row's tokens are not all its policy_version's (buffer/experience.py)
        versions = e.token_versions or [e.policy_version if m else -1 for m in e.response_mask]
        assert len(versions) == len(e.response_ids) == len(e.response_mask)
        assert all((v == -1) == (m == 0) for v, m in zip(versions, e.response_mask))  # -1 exactly on observations
        tagged = [v for v in versions if v != -1]
        assert tagged == sorted(tagged) and e.policy_version == tagged[0]
        assert all(e.rollout_log_probs[i] <= 0 for i, m in enumerate(e.response_mask) if m)
        observed += e.response_mask.count(0) > 0
    assert observed > 0  # some episodes took several moves (observations between model turns)
