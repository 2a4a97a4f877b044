"""Faults injected into real runs (the CLI, Ray, 2 colocated workers, tiny model, 3 steps, save every step).

Faults come from ``HYBRID_RL_FAULT`` (hybrid_rl/utils/faults.py), each firing once per run folder
(``HYBRID_RL_FAULT_STATE``), so a restarted or rerun attempt passes the point unharmed. Every run that
finishes must end with exactly the weights of the uninterrupted run (CPU, float32, same seed).
The time from a fault firing (its marker file's mtime) to the driver's exit is asserted bounded.
"""

import os
import time

import pytest
import torch
from pickle_scan import assert_no_pickle
from test_e2e import _assert_ok, _run_cli, _weights

pytestmark = pytest.mark.slow

NO_VAL = ("trainer.val_before_train=false", "trainer.val_at_end=false")


def _run(root, model_dir, fault=None, *extra):
    """(result, seconds from the first fault firing to the driver's exit or None)."""
    root.mkdir(exist_ok=True)
    env = {"HYBRID_RL_FAULT": fault or "", "HYBRID_RL_FAULT_STATE": str(root / "faults")}
    result = _run_cli(root, model_dir, *NO_VAL, *extra, env=env)
    end = time.time()
    markers = sorted((root / "faults").iterdir(), key=os.path.getmtime) if (root / "faults").exists() else []
    fired = [end - m.stat().st_mtime for m in markers]
    return result, (min(fired) if fired else None)


def _latest(root):
    return (root / "run" / "latest_checkpointed_iteration.txt").read_text()


def _assert_same_weights(a_root, b_root, step=3):
    a, b = _weights(a_root / "run" / f"global_step_{step}"), _weights(b_root / "run" / f"global_step_{step}")
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("straight")
    result, _ = _run(root, tiny_model_dir)
    _assert_ok(result)
    for step_dir in (root / "run").glob("global_step_*"):
        assert assert_no_pickle(step_dir) > 10  # a real checkpoint folder holds no pickle
    return root


def test_worker_sigkill_in_generate_and_update_restarts_to_same_weights(tmp_path, tiny_model_dir, straight):
    # rank 1 dies generating step 2, then (after the first restart) rank 0 dies updating step 3
    result, _ = _run(tmp_path, tiny_model_dir, "kill:generate_sequences:2:1,kill:update_actor:3:0",
                     "trainer.max_restarts=2")
    _assert_ok(result)
    log = result.stdout + result.stderr
    assert "restart 1/2 after a worker failure: training step 2, `generate`: worker actor_rollout rank 1/2" in log
    assert "restart 2/2 after a worker failure: training step 3, `update_actor`: worker actor_rollout rank 0/2" in log
    assert "Resumed from" in log and "global_step_2 (step 2)" in log
    _assert_same_weights(straight, tmp_path)


def test_driver_sigkill_at_commit_and_generate_then_rerun(tmp_path, tiny_model_dir, straight):
    # 1) killed after the workers wrote step 2 but before the driver marked it complete
    result, _ = _run(tmp_path, tiny_model_dir, "kill:driver.commit:2")
    assert result.returncode == -9
    half = tmp_path / "run" / "global_step_2"
    assert (half / "actor" / "checkpoint_meta.json").exists() and not (half / "trainer_state.json").exists()
    assert _latest(tmp_path) == "1"  # the half-written step is never the resume point
    # 2) the rerun resumes from step 1, redoes step 2 and is killed as it starts generating step 3
    result, _ = _run(tmp_path, tiny_model_dir, "kill:driver.commit:2,kill:driver.generate:3")
    assert result.returncode == -9
    assert _latest(tmp_path) == "2" and (half / "trainer_state.json").exists()
    # 3) the rerun of the same command finishes from step 2
    result, _ = _run(tmp_path, tiny_model_dir, "kill:driver.commit:2,kill:driver.generate:3")
    _assert_ok(result)
    _assert_same_weights(straight, tmp_path)


def test_worker_sigkill_mid_checkpoint_write_exits_nonzero_naming_it(tmp_path, tiny_model_dir):
    # rank 1 dies as the save of step 2 starts; rank 0 is left waiting in the middle of its write
    result, detect_s = _run(tmp_path, tiny_model_dir, "kill:save_checkpoint:2:1")
    assert result.returncode != 0
    assert "training step 2, `save_checkpoint`: worker actor_rollout rank 1/2" in result.stderr
    assert "died during `actor_rollout.save_checkpoint`" in result.stderr
    assert detect_s is not None and detect_s < 60, detect_s  # detected and torn down, never a hang
    print(f"worker SIGKILL mid-save: fault -> driver exit {detect_s:.1f} s")
    assert _latest(tmp_path) == "1"
    assert not (tmp_path / "run" / "global_step_2" / "trainer_state.json").exists()


def test_hung_worker_times_out_and_restarts_to_same_weights(tmp_path, tiny_model_dir, straight):
    timeout_s = 30  # well above any tiny-model call, even on a loaded 2-core machine
    start = time.time()
    result, _ = _run(tmp_path, tiny_model_dir, "hang:update_actor:2:0", f"trainer.worker_call_timeout_s={timeout_s}",
                     "trainer.max_restarts=1")
    _assert_ok(result)
    log = result.stdout + result.stderr
    assert (f"training step 2, `update_actor`: `actor_rollout.update_actor` did not finish within "
            f"call_timeout_s={timeout_s}") in log
    assert "workers did not answer: actor_rollout rank 0/2" in log  # rank 1 waits in its collective
    print(f"hung worker (timeout {timeout_s} s) + restart: whole run {time.time() - start:.1f} s")
    _assert_same_weights(straight, tmp_path)


def test_disk_full_during_checkpoint_write(tmp_path, tiny_model_dir):
    result, detect_s = _run(tmp_path, tiny_model_dir, "oserror:save_checkpoint:2")
    assert result.returncode != 0
    run = tmp_path / "run"
    assert "CheckpointSaveError: could not write checkpoint" in result.stderr
    assert "No space left on device" in result.stderr and f"{run / 'global_step_1'} stays the resume point" in result.stderr
    assert _latest(tmp_path) == "1" and not (run / "global_step_2").exists()
    assert detect_s < 60, detect_s
    print(f"ENOSPC at save: fault -> driver exit {detect_s:.1f} s")
