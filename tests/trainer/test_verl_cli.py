"""veRL's own GSM8K command lines (quickstart and example scripts, verbatim in ``verl_cli/``) are
accepted by our CLI: every key with veRL's value shapes, or one clear error for a key that cannot be
honoured (LoRA). Two of them also run for real, with paths made local and sizes scaled down."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_rl.trainer.config.loader import check_override_keys, get_config, to_ppo_config

LISTS = Path(__file__).parent / "verl_cli"
REPO = str(Path(__file__).resolve().parents[2])
_GSM8K, _MATH = "$HOME/data/gsm8k", "$HOME/data/math"
# The shell variables of examples/ppo_trainer/run_qwen2-7b_seq_balance.sh.
SCRIPT_VARS = {"train_files": f"['{_GSM8K}/train.parquet', '{_MATH}/train.parquet']",
               "test_files": f"['{_GSM8K}/test.parquet', '{_MATH}/test.parquet']",
               "rollout_mode": "async", "return_raw_chat": "True"}


def verl_argv(name: str) -> list[str]:
    """The argv bash passes for a list file (variables expanded, quotes removed); the docs/algo/ppo.md
    extras are appended to the run_gemma.sh script they extend."""
    lines = (LISTS / f"{name}.txt").read_text().splitlines()
    if name == "algo_ppo_doc_gemma_extra":
        lines = (LISTS / "ppo_run_gemma.txt").read_text().splitlines() + lines
    env = {**SCRIPT_VARS, "HOME": "/home/user"}
    argv = []
    for line in filter(None, (line.strip() for line in lines)):
        for var, value in env.items():
            line = line.replace(f"${var}", value)
        argv += shlex.split(line.replace("$HOME", env["HOME"]))
    return _last_value_wins(argv)


def _last_value_wins(argv: list[str]) -> list[str]:
    by_key = {}
    for arg in argv:
        by_key[arg.split("=", 1)[0]] = arg
    return list(by_key.values())


ACCEPTED = ["quickstart_ppo", "gsm8k_example_doc_ppo", "algo_ppo_doc_gemma_extra", "ppo_run_deepseek7b_llm",
            "ppo_run_qwen2-7b_seq_balance", "ppo_run_gemma", "grpo_run_qwen2-7b", "grpo_run_deepseek7b_llm",
            "grpo_run_qwen3-8b", "grpo_run_qwen2_5-3b_gsm8k_grpo_lora"]


@pytest.mark.parametrize("name", ACCEPTED)
def test_verl_command_line_composes(name):
    argv = verl_argv(name)
    check_override_keys(argv)
    cfg = to_ppo_config(get_config(argv))
    assert cfg.trainer.n_gpus_per_node == int(dict(a.split("=", 1) for a in argv)["trainer.n_gpus_per_node"])
    if "trainer.logger=console" in argv:
        assert cfg.trainer.logger == "console"


def test_global_micro_batch_and_rollout_keys_are_honoured():
    cfg = to_ppo_config(get_config(verl_argv("algo_ppo_doc_gemma_extra")))
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size == 2 and cfg.critic.ppo_micro_batch_size == 2
    seq = to_ppo_config(get_config(verl_argv("ppo_run_qwen2-7b_seq_balance")))
    rollout = seq.actor_rollout_ref.rollout
    assert rollout.mode == "async" and rollout.log_prob_max_token_len_per_gpu == 24000
    assert seq.data.return_raw_chat is True and len(seq.data.train_files) == 2
    assert seq.critic.model.fsdp_config.param_offload is False


def test_lora_list_turns_on_the_lora_actor():
    model = to_ppo_config(get_config(verl_argv("grpo_run_qwen2_5-3b_gsm8k_grpo_lora"))).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (64, 32, "all-linear")


@pytest.mark.parametrize("override, match", [
    ("trainer.use_legacy_worker_impl=disable", "new engine workers"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml", "multi_turn.enable=true to use them"),
    ("critic.model.lora_rank=8", "critic trains every parameter"),
    ("actor_rollout_ref.model.lora_rank=-1", "lora_rank"),
    ("actor_rollout_ref.rollout.load_format=pt", "load_format"),
])
def test_keys_we_cannot_honour_fail_in_one_line(override, match):
    from hybrid_rl.trainer.config.checks import validate_config

    with pytest.raises(ValueError, match=match) as info:
        validate_config(to_ppo_config(get_config([override])))
    assert "\n" not in str(info.value)


def _scaled_down(argv: list[str], tmp_path, model_dir: str, data: dict) -> list[str]:
    """Paths made local; batch, length and worker sizes that fit a 2-core CPU test; one step."""
    local = {"data.train_files": data["train"], "data.val_files": data["test"],
             "actor_rollout_ref.model.path": model_dir, "critic.model.path": model_dir,
             "trainer.logger": "console", "trainer.n_gpus_per_node": "1", "data.train_batch_size": "4",
             "data.max_prompt_length": "200", "data.max_response_length": "8",
             "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "actor_rollout_ref.rollout.n": "2",
             "actor_rollout_ref.rollout.tensor_model_parallel_size": "1", "actor_rollout_ref.rollout.name": "hf"}
    kept = [a for a in argv if a.split("=", 1)[0] not in local]
    return kept + [f"{k}={v}" for k, v in local.items()] + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.progress_bar=false",
        f"trainer.default_local_dir={tmp_path}/run", "ray_init.num_cpus=2"]


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory):
    """A few rows in the format scripts/data/gsm8k.py writes."""
    import pandas as pd

    out = tmp_path_factory.mktemp("gsm8k")
    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": f"What is {i} + {i}? Let's think step by step and output "
                                                    "the final answer after \"####\"."}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
            for i in range(8)]
    paths = {}
    for split in ("train", "test"):
        paths[split] = str(out / f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(paths[split])
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart_ppo", "grpo_run_qwen2-7b"])
def test_verl_command_line_runs_with_local_paths(name, tmp_path, tiny_model_dir, gsm8k_parquet):
    argv = _scaled_down(verl_argv(name), tmp_path, tiny_model_dir, gsm8k_parquet)
    cmd = [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *argv]
    result = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step:1" in result.stdout


def test_notices_when_our_defaults_change_a_verl_command():
    from hybrid_rl.trainer.config.verl_compat import verl_default_notices

    argv = verl_argv("quickstart_ppo")
    notices = verl_default_notices(to_ppo_config(get_config(argv)), argv)
    assert len(notices) == 3
    assert "algorithm.adv_estimator=gae" in notices[0] and "trainer.total_training_steps=null" in notices[2]
    assert "actor_rollout_ref.actor.use_dynamic_bsz=false" in notices[1]
    fixed = argv + ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1", "trainer.total_training_steps=null",
                    "actor_rollout_ref.actor.use_dynamic_bsz=false"]
    assert verl_default_notices(to_ppo_config(get_config(fixed)), fixed) == []
    gae_only = argv + ["algorithm.adv_estimator=gae", "trainer.total_training_steps=null",
                       "actor_rollout_ref.actor.use_dynamic_bsz=false"]
    (notice,) = verl_default_notices(to_ppo_config(get_config(gae_only)), gae_only)
    assert "actor_rollout_ref.rollout.n=1" in notice


def test_verl_gsm8k_sft_command_line_runs(tmp_path, tiny_model_dir):
    """veRL's GSM8K SFT example (v0.6 ``examples/sft/gsm8k/run_gemma_2b.sh``, ``verl_cli/``): the prompt
    and response are ``extra_info.question`` / ``.answer`` of scripts/data/gsm8k.py's parquet
    (``data.prompt_dict_keys`` / ``response_dict_keys``), on real GSM8K rows; model and sizes local."""
    import json

    import gsm8k_data

    gsm8k = gsm8k_data.script()
    rows = gsm8k.read_splits(**gsm8k_data.source())  # the real GSM8K, or a skip saying it is not here
    (tmp_path / "gsm8k").mkdir()
    for split in ("train", "test"):
        gsm8k.write_parquet(rows[split][:8], tmp_path / "gsm8k" / f"{split}.parquet")
    argv = [a.replace("/home/user/data/gsm8k", str(tmp_path / "gsm8k")).replace("$save_path", str(tmp_path / "run"))
            for a in verl_argv("sft_run_gemma_2b")]
    local = [f"model.partial_pretrain={tiny_model_dir}", "trainer.logger=[jsonl]", "data.train_batch_size=4",
             "data.max_length=1024", "data.truncation=left", "trainer.total_training_steps=1",
             "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.val_at_end=false",
             "trainer.progress_bar=false", "model.fsdp_config.mixed_precision.param_dtype=float32"]
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_sft", *argv, *local], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["train/loss"] > 0
