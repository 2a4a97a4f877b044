"""Checkpoint layout, atomic commit, rotation and resume resolution (no workers involved)."""

import os
import random

import numpy as np
import pytest
import torch

from hybrid_rl.trainer.core.checkpoints import (
    LATEST_FILE,
    STATE_FILE,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)


def _save(mgr: CheckpointManager, step: int, commit: bool = True) -> None:
    mgr.begin(step)
    os.makedirs(mgr.actor_dir(step))
    open(os.path.join(mgr.actor_dir(step), "model.safetensors"), "w").write("w")
    if commit:
        mgr.commit(step, {"dataloader": {"epoch": 0, "batch_in_epoch": step}})


def test_commit_writes_state_then_pointer(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    assert mgr.latest_step() is None and mgr.resolve_resume("auto", None) is None
    _save(mgr, 2)
    assert (tmp_path / LATEST_FILE).read_text() == "2"
    point = mgr.resolve_resume("auto", None)
    assert point.global_step == 2 and point.state["dataloader"]["batch_in_epoch"] == 2
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]  # no temp files left behind


def test_interrupted_save_is_never_picked(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 2)
    _save(mgr, 4, commit=False)  # killed while the workers were writing step 4
    assert mgr.resolve_resume("auto", None).global_step == 2
    with pytest.raises(ValueError, match="incomplete"):
        mgr.resolve_resume("resume_path", str(tmp_path / "global_step_4"))
    # the re-run of step 4 replaces the partial folder
    _save(mgr, 4)
    assert mgr.resolve_resume("auto", None).global_step == 4
    assert sorted(os.listdir(tmp_path / "global_step_4")) == ["actor", STATE_FILE]


def test_rotation_keeps_newest(tmp_path):
    mgr = CheckpointManager(str(tmp_path), max_to_keep=2)
    for step in (1, 2, 3, 4):
        _save(mgr, step)
    assert mgr.list_steps() == [3, 4]
    with pytest.raises(ValueError, match="max_actor_ckpt_to_keep"):
        CheckpointManager(str(tmp_path), max_to_keep=0)


def test_redo_of_latest_step_moves_pointer_back(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 1)
    _save(mgr, 2)
    mgr.begin(2)  # resumed from step 1 via resume_path, now re-saving step 2
    assert mgr.latest_step() == 1
    mgr.commit(2, {})
    assert mgr.latest_step() == 2


def test_resume_modes_and_errors(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 3)
    assert mgr.resolve_resume("disable", None) is None
    assert mgr.resolve_resume("resume_path", str(tmp_path / "global_step_3")).global_step == 3
    with pytest.raises(ValueError, match="resume_from_path"):
        mgr.resolve_resume("resume_path", None)
    with pytest.raises(ValueError, match="not a global_step_N folder"):
        mgr.resolve_resume("resume_path", str(tmp_path))
    with pytest.raises(ValueError, match="resume_mode"):
        mgr.resolve_resume("latest", None)
    (tmp_path / LATEST_FILE).write_text("garbage")
    with pytest.raises(ValueError, match="not a step number"):
        mgr.resolve_resume("auto", None)


def test_rng_state_roundtrip_through_json():
    import json

    state = json.loads(json.dumps(capture_rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
