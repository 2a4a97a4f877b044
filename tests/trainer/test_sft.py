"""``python -m hybrid_rl.trainer.main_sft``: veRL's SFT keys, the loss falling, bit-exact resume after
SIGKILL, one-line bad input."""

import json
import os
import subprocess
import sys

import pytest

from hybrid_rl.trainer.config.supervised import SFTConfig, sft_actor_config
from hybrid_rl.trainer.config.supervised_checks import validate_sft_config
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.main_sft import sft_config
from tests.trainer.mode_runs import assert_resumes_bit_exactly, launcher
from tests.trainer.test_e2e import REPO


def test_verl_sft_keys_build_the_actor_workers_config(tmp_path):
    cfg = sft_config(["model.partial_pretrain=/m", "optim.lr=2e-5", "data.train_batch_size=8",
                      "data.micro_batch_size_per_gpu=2", "data.use_dynamic_bsz=false", "trainer.total_epochs=3",
                      "model.lora_rank=8", "optim.clip_grad=0.5"])
    assert isinstance(cfg, SFTConfig) and cfg.trainer.total_epochs == 3 and cfg.trainer.experiment_name == "sft"
    arr = sft_actor_config(cfg)
    assert arr.model.path == "/m" and arr.model.lora_rank == 8 and arr.actor.optim.lr == 2e-5
    assert arr.actor.ppo_mini_batch_size == 8  # one optimizer step per batch
    assert arr.actor.ppo_micro_batch_size_per_gpu == 2 and not arr.actor.use_dynamic_bsz and arr.actor.grad_clip == 0.5
    assert arr.actor.objective == {"name": "nll"} and arr.rollout.n == 1  # the NLL, not a PPO loss
    assert arr.actor.policy_loss.loss_mode == "vanilla"  # no PPO input is faked for a "sft" policy loss
    assert cfg.rollout.response_length == cfg.data.max_response_length == 16  # the held-out answers' length follows
    train, val = supervised_data_files(sft_config([f"data.arithmetic.cache_dir={tmp_path}"]).data, "sft")
    assert os.path.isfile(train[0]) and train[0].endswith("sft_train.parquet") and val[0].endswith("sft_test.parquet")


@pytest.mark.parametrize("overrides, message", [
    (["optim.lr"], "write key=value"),
    (["actor_rollout_ref.actor.optim.lr=1e-5"], "Unknown config key 'actor_rollout_ref.actor.optim.lr'"),
    (["algorithm.adv_estimator=grpo"], "Unknown config key 'algorithm.adv_estimator'"),  # no PPO keys in SFT
    (["data.respone_key=a"], "Did you mean 'data.response_key'"),
])
def test_sft_command_line_mistakes_are_one_line(overrides, message):
    from hybrid_rl.trainer.main_sft import SFT_MODE
    from hybrid_rl.trainer.supervised_cli import _parse, compose

    with pytest.raises(ValueError, match=message):
        compose(SFT_MODE, _parse(overrides)[0])


@pytest.mark.parametrize("overrides, message", [
    (["rollout.n=4"], r"rollout.n=4: SFT samples no responses"),
    (["data.max_token_len_per_gpu=512"], r"data.max_token_len_per_gpu=512 is smaller than one conversation"),
    (["data.truncation=middle"], r"data.truncation='middle' must be one of"),
    (["trainer.n_gpus_per_node=2", "ray_init.num_cpus=2", "data.train_batch_size=3"],
     r"data.train_batch_size=3 must be a positive multiple of the 2 workers"),
    (["rollout.response_length=8"], r"rollout.response_length=8 differs from data.max_response_length=16"),
])
def test_sft_checks_name_its_own_keys(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_sft_config(sft_config(overrides))


_sft = launcher("main_sft", "data.max_prompt_length=160", "data.max_response_length=8", "data.train_batch_size=8",
                "data.micro_batch_size_per_gpu=4", "rollout.name=hf", "rollout.dtype=float32",
                "trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.save_freq=2",
                "trainer.val_before_train=true")


@pytest.mark.slow
def test_sft_lowers_the_held_out_loss_and_resumes_bit_exactly(tmp_path, tiny_model_dir):
    result = _sft(tmp_path, tiny_model_dir, "run")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [r["val/sft_loss"] for r in rows if "val/sft_loss" in r]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0]  # before training, steps 2 and 4
    assert sum("train/loss" in r for r in rows) == 4  # the step-0 row holds the validation only
    trained = [r for r in rows if "train/loss" in r]
    assert all(r["train/loss"] == r["sft/loss"] for r in trained)  # veRL's name of the nll objective's loss
    ppo_names = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy"}
    assert not ppo_names & {k for r in rows for k in r}, "an SFT run logs PPO metrics"
    log = (tmp_path / "run" / "logs" / "driver.log").read_text()  # one CPU worker: no Ray, as main_ppo
    assert "in the driver's process" in log and "started a local Ray instance" not in log
    assert_resumes_bit_exactly(_sft, tmp_path, tiny_model_dir, "kill:driver.update_actor:3", 4)


def test_bad_sft_input_is_one_line(tmp_path, tiny_model_dir):
    rows = tmp_path / "sft.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "answer": "a"}) + "\n")
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_sft", f"data.train_files={rows}",
                             f"model.partial_pretrain={tiny_model_dir}", "data.train_batch_size=1"],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"hybrid_rl config error: {rows}, row 1: no 'response' column (columns: ['answer', 'prompt']). Fix: set "
        "data.response_key to the right column.")
