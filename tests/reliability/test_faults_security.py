"""Checkpoints are written and read without pickle: a checkpoint folder holds no pickle, and a file
replaced by a malicious pickle is rejected without running it."""

import os
import re

import pytest
import torch
from pickle_scan import assert_no_pickle
from torch import nn

import hybrid_rl
from hybrid_rl.trainer.core.checkpoints import STATE_FILE, CheckpointManager
from hybrid_rl.workers import checkpoint as ckpt


class _Payload:
    """Unpickling this object creates ``marker``: proof that a loader executed checkpoint content."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def saved(tmp_path):
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    manager = CheckpointManager(str(tmp_path / "run"))
    manager.begin(1)
    ckpt.save_checkpoint(manager.actor_dir(1), model=model, optimizer=optimizer)
    manager.commit(1, {"rng": [1, 2, 3]})
    return manager, model, optimizer


def test_checkpoint_folder_holds_no_pickle(saved):
    manager, _, _ = saved
    assert assert_no_pickle(manager.root) >= 5  # model, optim, extra, meta, trainer state, pointer


@pytest.mark.parametrize("target", ["model_world_1_rank_0.safetensors", "optim_world_1_rank_0.safetensors"])
def test_tampered_worker_file_fails_without_running_it(saved, tmp_path, target):
    manager, model, optimizer = saved
    marker = tmp_path / "pwned"
    torch.save({"w": _Payload(marker)}, os.path.join(manager.actor_dir(1), target))
    with pytest.raises(Exception) as excinfo:
        ckpt.load_checkpoint(manager.actor_dir(1), model=model, optimizer=optimizer)
    assert "safetensor" in type(excinfo.value).__name__.lower() or "header" in str(excinfo.value).lower()
    assert not marker.exists()


def test_tampered_driver_state_fails_without_running_it(saved, tmp_path):
    manager, _, _ = saved
    marker = tmp_path / "pwned"
    torch.save(_Payload(marker), os.path.join(manager.step_dir(1), STATE_FILE))
    with pytest.raises(ValueError, match=r"trainer_state.json is not a valid driver state .* resume from an earlier"):
        manager.resolve_resume("auto", None)
    assert not marker.exists()


def test_no_unsafe_deserialisation_in_the_package():
    """torch.load only with weights_only=True; pickle only for the reward guard's in-memory pipe."""
    root = os.path.dirname(hybrid_rl.__file__)
    offenders = []
    for dirpath, _, names in os.walk(root):
        for name in (n for n in names if n.endswith(".py")):
            path = os.path.join(dirpath, name)
            text = open(path, encoding="utf-8").read()
            for call in re.findall(r"torch\.load\([^)]*\)", text):
                if "weights_only=True" not in call:
                    offenders.append(f"{path}: {call}")
            if re.search(r"\bpickle\.loads?\(|\bnp\.load\([^)]*allow_pickle=True", text) and name != "_isolation.py":
                offenders.append(f"{path}: unpickles")
    assert not offenders, offenders
