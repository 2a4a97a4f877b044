"""``python -m hybrid_rl.trainer.main_sft``: veRL's SFT keys, the loss falling, bit-exact resume after
SIGKILL, one-line bad input."""

import json
import os
import subprocess
import sys

import pytest
import torch

from hybrid_rl.trainer.main_sft import sft_overrides
from tests.trainer.test_e2e import REPO, _weights


def test_verl_sft_keys_are_translated(tmp_path):
    out = sft_overrides(["model.partial_pretrain=/m", "optim.lr=2e-5", "data.train_batch_size=8",
                         "data.micro_batch_size_per_gpu=2", "data.train_files=/t.parquet", "trainer.total_epochs=3"])
    assert "actor_rollout_ref.model.path=/m" in out and "actor_rollout_ref.actor.optim.lr=2e-5" in out
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=8" in out  # one optimizer step per batch
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2" in out
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=sft" in out and "trainer.total_epochs=3" in out
    assert "trainer.total_epochs=1" not in out and "trainer.experiment_name=sft" in out  # defaults unless given
    generated = sft_overrides([f"data.arithmetic.cache_dir={tmp_path}"])  # no train files: the arithmetic SFT data
    train = next(o for o in generated if o.startswith("data.train_files=")).split("=", 1)[1]
    assert os.path.isfile(train) and train.endswith("sft_train.parquet")
    with pytest.raises(ValueError, match="write key=value"):
        sft_overrides(["optim.lr"])


def _sft(tmp_path, model_dir, run, *extra, env=None):
    args = [f"model.partial_pretrain={model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
            "data.arithmetic.num_test=8", "data.max_prompt_length=160", "data.max_response_length=8",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32", "optim.lr=1e-3",
            "trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.save_freq=2",
            "trainer.val_before_train=true", "trainer.progress_bar=false", f"trainer.default_local_dir={tmp_path}/{run}",
            "ray_init.num_cpus=2", *extra]
    return subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_sft", *args], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=REPO, **(env or {})), capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_sft_lowers_the_held_out_loss_and_resumes_bit_exactly(tmp_path, tiny_model_dir):
    result = _sft(tmp_path, tiny_model_dir, "run")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [r["val/sft_loss"] for r in rows if "val/sft_loss" in r]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0]  # before training, steps 2 and 4
    assert sum("train/loss" in r for r in rows) == 4  # the step-0 row holds the validation only
    env = {"HYBRID_RL_FAULT": "kill:driver.update_actor:3", "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    assert _sft(tmp_path, tiny_model_dir, "killed", env=env).returncode != 0
    resumed = _sft(tmp_path, tiny_model_dir, "killed", env=env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    want, got = _weights(tmp_path / "run" / "global_step_4"), _weights(tmp_path / "killed" / "global_step_4")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_bad_sft_input_is_one_line(tmp_path, tiny_model_dir):
    rows = tmp_path / "sft.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "answer": "a"}) + "\n")
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_sft", f"data.train_files={rows}",
                             f"model.partial_pretrain={tiny_model_dir}", "data.train_batch_size=1"],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"hybrid_rl config error: {rows}, row 0: no 'response' column (columns: ['answer', 'prompt']). Fix: set "
        "data.response_key to the right column.")
