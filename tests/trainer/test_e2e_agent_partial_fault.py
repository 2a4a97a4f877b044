"""Kill -9 mid partial rollout with agent rows: the guess-the-number environment (``EnvAgentLoop``) streamed with
``async_training.partial_rollout=true`` on the tiny model; the rollout worker is SIGKILLed while loading version 2
with episodes in flight. The restarted run trains every group once, none twice, none lost; every buffered row keeps
per-token versions (-1 on observations) and behaviour log-probs; no shared-memory segment is left; each step logs
the batch path's ``agent/*`` metrics over the rows it trained. (It covers every check of the former uninterrupted
agent-row partial-rollout test as well.)"""

import glob
import json
import subprocess
import sys
from collections import Counter

import pytest

from hybrid_rl.agents.loop import END_REASONS
from tests.trainer.test_e2e import REPO, _assert_ok, _rows, _run_cli
from tests.trainer.test_e2e_agent import chatty_model_dir  # noqa: F401 - a fixture: ends turns with EOS often
from tests.trainer.test_e2e_async import DECOUPLED_LOSS, ROWS_PER_STEP, _async_args, _buffer_rows, _reward_args
from tests.trainer.test_e2e_partial_rollout import N, _assert_versions_and_log_probs, _dead_segments

pytestmark = pytest.mark.slow

STEPS = 3
GROUPS = ROWS_PER_STEP // N


def _assert_groups_once(rows, next_batch):
    """Each step trained whole groups of one batch's size; no group buffered twice; every prompt batch before
    ``next_batch`` (the final checkpoint's first batch with a group not yet buffered) is whole: none lost."""
    assert Counter(e.taken_step for e in rows if e.status == "taken") == {s: ROWS_PER_STEP for s in range(1, STEPS + 1)}
    per_group = Counter((e.extra["rollout_batch"], e.extra["rollout_group"]) for e in rows)
    assert set(per_group.values()) == {N}  # a group generated twice would have 2n rows
    assert next_batch > 1
    assert all((b, g) in per_group for b in range(1, next_batch) for g in range(GROUPS))
    for step in range(1, STEPS + 1):
        groups = Counter((e.extra["rollout_batch"], e.extra["rollout_group"]) for e in rows if e.taken_step == step)
        assert set(groups.values()) == {N}


def test_agent_rows_resume_after_a_rollout_sigkill_mid_partial_rollout(tmp_path, chatty_model_dir):
    data = tmp_path / "guess_number"
    subprocess.run([sys.executable, "-m", "hybrid_rl.data.guess_number", "--out_dir", str(data), "--num_train", "16",
                    "--num_test", "2"], check=True, capture_output=True)
    args = [*_reward_args(tmp_path),
            *_async_args("async_training.buffer.storage_type=sql", "async_training.partial_rollout=true",
                         "async_training.max_head_offpolicyness=1", *DECOUPLED_LOSS),
            f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
            "data.max_prompt_length=640", "data.max_response_length=160", "actor_rollout_ref.rollout.temperature=1.0",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={REPO}/recipes/guess_number_env/agents.yaml",
            f"trainer.total_training_steps={STEPS}", "trainer.max_restarts=1"]
    env = {"HYBRID_RL_FAULT": "kill:stream_load_weights:2", "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    shm_before = set(glob.glob("/dev/shm/hybrid_rl_wt_*"))
    result = _run_cli(tmp_path, chatty_model_dir, *args, env=env)
    _assert_ok(result)
    assert "restart 1/1 after a worker failure" in result.stderr + result.stdout
    assert _dead_segments(shm_before) == set()  # the run's pushes gave their memory back
    state = json.loads((tmp_path / "run" / f"global_step_{STEPS}" / "trainer_state.json").read_text())
    rows = _buffer_rows(tmp_path / "run")
    _assert_groups_once(rows, int(state["async"]["next_batch"]))
    _assert_versions_and_log_probs(rows, eta=1)
    for e in rows:
        versions = e.token_versions or [e.policy_version if m else -1 for m in e.response_mask]
        assert len(versions) == len(e.response_ids) == len(e.response_mask)
        assert all((v == -1) == (m == 0) for v, m in zip(versions, e.response_mask))  # -1 exactly on observations
    assert any(0 in e.response_mask for e in rows)  # some episodes took several moves (observations between turns)
    logged = [r for r in _rows(tmp_path / "run") if "training/global_step" in r]
    assert logged[-1]["training/global_step"] == STEPS
    for r in logged:  # the batch path's agent/* keys over the step's rows (a row's turns: prompt + >= 1 model turn)
        assert r["agent/num_turns/mean"] >= 2 and 0 <= r["agent/observation_token_fraction"] < 1
        assert sum(r[f"agent/ended_by/{reason}"] for reason in END_REASONS) == pytest.approx(1.0)
        assert "agent/loop/env_steps" in r
