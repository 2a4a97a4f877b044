"""``--cfg job`` refuses what the run refuses: the same ONE line, exit 2, for each bad input.

``--cfg job`` prints the resolved config without running; it used to check only the sections' own
values, so 23 of 38 bad inputs printed a config and exited 0 where the run refused 22 of them. Now it
runs the run's config checks (``validate_config`` / ``validate_sft_config`` / ``validate_rm_config``:
ranges, cross-field rules, files and folders on disk), none of which loads a model or starts Ray.
Each case below goes through the entry point twice, in-process through ``main(argv)``: as a run
(stopped by the first check; ``ray_init.address`` points nowhere so a case the checks let through
would fail on the cluster, with another line) and with ``--cfg job``; a few run as real subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

import pytest

from hybrid_rl.trainer import main_ppo, main_rm, main_sft

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "hybrid_rl config error: "
CFG_JOB = ["--cfg", "job"]
UNWRITABLE = "/proc/hybrid_rl_run"  # mkdir in /proc fails even for root (os.access would say yes)


def _ppo_base(tmp: str, model: str) -> list[str]:
    row = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
           "reward_model": {"style": "rule", "ground_truth": "2"}}
    with open(os.path.join(tmp, "good.jsonl"), "w", encoding="utf-8") as f:
        f.write((json.dumps(row) + "\n") * 8)
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={tmp}/good.jsonl",
            "data.max_prompt_length=160", "data.max_response_length=8", "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.n_gpus_per_node=2", "ray_init.num_cpus=2", "ray_init.address=127.0.0.1:1",
            f"trainer.default_local_dir={tmp}/run"]


def _supervised_base(tmp: str, model: str) -> list[str]:
    return [f"model.partial_pretrain={model}", "trainer.n_gpus_per_node=2", "data.train_batch_size=4",
            "ray_init.num_cpus=2", "ray_init.address=127.0.0.1:1", f"trainer.default_local_dir={tmp}/run"]


# Each case: (overrides given a scratch folder, the line's expected text after the prefix).
Case = tuple[Callable[[str], list[str]], str]
PPO_CASES: dict[str, Case] = {
    "missing_data_file": (lambda t: [f"data.train_files={t}/nope.jsonl"],
                          "data.train_files: file '{t}/nope.jsonl' does not exist; fix the path or leave "
                          "data.train_files unset."),
    "zero_batch": (lambda t: ["data.train_batch_size=0"],
                   "data.train_batch_size=0 is invalid: must be >= 1. Fix: use a positive number of prompts."),
    "unknown_estimator": (lambda t: ["algorithm.adv_estimator=nope"],
                          "algorithm.adv_estimator='nope' is not registered; valid: ['gae', "),
    "missing_model": (lambda t: [f"actor_rollout_ref.model.path={t}/no_model"],
                      "actor_rollout_ref.model.path='{t}/no_model' is not a local HF model folder (no config.json)"),
    "missing_reward_file": (lambda t: [f"custom_reward_function.path={t}/nope.py"],
                            "custom_reward_function.path='{t}/nope.py' does not exist; point it at a .py file or "
                            "set it to null."),
    "reward_file_is_a_folder": (lambda t: [f"custom_reward_function.path={t}"],
                                "custom_reward_function.path='{t}' is a folder, not a file; point it at a .py file "
                                "or set it to null."),
    "tool_yaml_is_a_folder": (lambda t: ["actor_rollout_ref.rollout.multi_turn.enable=true",
                                         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={t}"],
                              "actor_rollout_ref.rollout.multi_turn.tool_config_path='{t}' is a folder, not a file; "
                              "point it at a YAML file (see docs/agents.md)."),
    "lr_inf": (lambda t: ["actor_rollout_ref.actor.optim.lr=inf"],
               "actor_rollout_ref.actor.optim.lr=inf is invalid: must be a finite number >= 0. Fix: use a "
               "non-negative learning rate."),
    "lr_1e999": (lambda t: ["critic.optim.lr=1e999"],
                 "critic.optim.lr=inf is invalid: must be a finite number >= 0. Fix: use a non-negative learning "
                 "rate."),
    "gamma_nan": (lambda t: ["algorithm.gamma=nan"],
                  "algorithm.gamma=nan is invalid: must be a finite number in [0, 1]. Fix: use e.g. 1.0."),
    "entropy_coeff_minus_inf": (lambda t: ["actor_rollout_ref.actor.entropy_coeff=-inf"],
                                "actor_rollout_ref.actor.entropy_coeff=-inf is invalid: must be a finite number. "
                                "Fix: use a finite number."),
    "run_dir_under_a_file": (lambda t: [f"trainer.default_local_dir={t}/good.jsonl/run"],
                             "trainer.default_local_dir='{t}/good.jsonl/run' cannot hold the run's files: "
                             "{t}/good.jsonl is a file, not a folder. Fix: point trainer.default_local_dir at a "
                             "folder you can write (it is created if missing)."),
    "run_dir_unwritable": (lambda t: [f"trainer.default_local_dir={UNWRITABLE}"],
                           f"trainer.default_local_dir='{UNWRITABLE}' cannot hold the run's files: cannot create a "
                           "folder in /proc ("),
    "stale_rows_without_correction": (lambda t: ["async_training.enable=true", "trainer.n_gpus_per_node=1",
                                                 "rollout.n_gpus_per_node=1",
                                                 "actor_rollout_ref.rollout.calculate_log_probs=true"],
                                      "async_training.max_head_offpolicyness=1 trains rows sampled by weights up to 1 "
                                      "version(s) old, but actor_rollout_ref.actor.policy_loss.loss_mode=vanilla "
                                      "without a rollout correction"),
    "tokenizer_path_missing": (lambda t: [f"actor_rollout_ref.model.tokenizer_path={t}/no_tok"],
                               "actor_rollout_ref.model.tokenizer_path='{t}/no_tok' does not exist; point it at a local "
                               "tokenizer folder or set it to null (the model's own)."),
    "arithmetic_cache_is_a_file": (lambda t: ["data.train_files=null", f"data.arithmetic.cache_dir={t}/good.jsonl"],
                                   "data.arithmetic.cache_dir='{t}/good.jsonl' cannot hold the built-in task's files: "
                                   "{t}/good.jsonl is a file, not a folder. Fix: point it at a folder you can write, "
                                   "or set data.train_files."),
    "unknown_bad_rows_policy": (lambda t: ["data.bad_rows=ignore"], "data.bad_rows='ignore' must be one of"),
    "grpo_with_n_1": (lambda t: ["actor_rollout_ref.rollout.n=1"], "algorithm.adv_estimator=grpo compares"),
    "resume_path_missing": (lambda t: ["trainer.resume_mode=resume_path"],
                            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>."),
}
SFT_CASES: dict[str, Case] = {
    "lr_inf": (lambda t: ["optim.lr=inf"],
               "optim.lr=inf is invalid: must be a finite number >= 0. Fix: use a non-negative learning rate."),
    "clip_grad_inf": (lambda t: ["optim.clip_grad=inf"], "optim.clip_grad=inf is invalid: must be a finite number > 0 "
                                                         "or null."),
    "missing_data_file": (lambda t: [f"data.train_files={t}/nope.jsonl"],
                          "data.train_files: file '{t}/nope.jsonl' does not exist"),
    "truncation": (lambda t: ["data.truncation=middle"], "data.truncation='middle' must be one of"),
    "batch_over_workers": (lambda t: ["data.train_batch_size=3"],
                           "data.train_batch_size=3 must be a positive multiple of the 2 workers"),
    "token_budget": (lambda t: ["data.max_token_len_per_gpu=10"],
                     "data.max_token_len_per_gpu=10 is smaller than one conversation of up to data.max_length=1024"),
    "rollout_n": (lambda t: ["rollout.n=2"], "rollout.n=2: SFT samples no responses to train on"),
    "missing_model": (lambda t: [f"model.partial_pretrain={t}/no_model"],
                      "model.partial_pretrain='{t}/no_model' is not a local HF model folder"),
    "reward_file_is_a_folder": (lambda t: [f"custom_reward_function.path={t}"],
                                "custom_reward_function.path='{t}' is a folder, not a file;"),
    "run_dir_unwritable": (lambda t: [f"trainer.default_local_dir={UNWRITABLE}"],
                           f"trainer.default_local_dir='{UNWRITABLE}' cannot hold the run's files"),
    "arithmetic_cache_under_a_file": (lambda t: [f"data.arithmetic.cache_dir={t}/file/arithmetic"],
                                      "data.arithmetic.cache_dir='{t}/file/arithmetic' cannot hold the built-in "
                                      "task's files: {t}/file is a file, not a folder."),
}
RM_CASES: dict[str, Case] = {
    "lr_1e999": (lambda t: ["optim.lr=1e999"], "optim.lr=inf is invalid: must be a finite number >= 0."),
    "empty_data_folder": (lambda t: [f"data.train_files={t}/empty"],
                          "data.train_files: data folder '{t}/empty' holds no data files"),
    "zero_micro_batch": (lambda t: ["data.micro_batch_size_per_gpu=0"],
                         "data.micro_batch_size_per_gpu=0 is invalid: must be >= 1."),
    "missing_model": (lambda t: [f"model.partial_pretrain={t}/no_model"],
                      "model.partial_pretrain='{t}/no_model' is not a local HF model folder"),
    "run_dir_under_a_file": (lambda t: [f"trainer.default_local_dir={t}/file/run"],
                             "trainer.default_local_dir='{t}/file/run' cannot hold the run's files: {t}/file is a "
                             "file, not a folder."),
}
MODES = {"ppo": (main_ppo, _ppo_base, PPO_CASES), "sft": (main_sft, _supervised_base, SFT_CASES),
         "rm": (main_rm, _supervised_base, RM_CASES)}


def _one_line(rc, err: str) -> str:
    """The contract: exit 2, no traceback, exactly one line with the prefix, and it is the last."""
    assert rc == main_ppo.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert sum(ln.startswith(PREFIX) for ln in lines) == 1 and lines[-1].startswith(PREFIX), err[-3000:]
    return lines[-1][len(PREFIX):]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main"])  # main(argv) sets it
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)  # main_ppo may set it
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("not a folder")
    return str(tmp_path)


def _in_process(module, argv: list[str], capsys) -> tuple[int, str, str]:
    """``module.main(argv)`` -> (exit status, stdout, stderr); 0 when it returns."""
    capsys.readouterr()
    try:
        module.main(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("mode, name", [(m, n) for m, (_, _, cases) in MODES.items() for n in cases])
def test_cfg_job_refuses_what_the_run_refuses_with_the_same_line(mode, name, scratch, tiny_model_dir, capsys):
    module, base, cases = MODES[mode]
    extra, expected = cases[name]
    argv = base(scratch, tiny_model_dir) + extra(scratch)
    run_line = _one_line(*_in_process(module, argv, capsys)[::2])
    code, out, err = _in_process(module, argv + CFG_JOB, capsys)
    assert out == ""  # nothing printed as if the config were fine
    assert _one_line(code, err) == run_line
    assert run_line.startswith(expected.replace("{t}", scratch)), run_line


@pytest.mark.parametrize("mode", list(MODES))
def test_cfg_job_of_a_valid_config_prints_it(mode, scratch, tiny_model_dir, capsys):
    """Guards the cases: without the one broken thing, --cfg job passes every check and prints the YAML."""
    module, base, _ = MODES[mode]
    code, out, err = _in_process(module, base(scratch, tiny_model_dir) + CFG_JOB, capsys)
    assert code == 0 and PREFIX not in err, err[-3000:]
    assert f"default_local_dir: {scratch}/run" in out
    assert not os.path.exists(f"{scratch}/run")  # the write probe leaves nothing behind


@pytest.mark.parametrize("module, args, expected", [
    ("main_ppo", ["actor_rollout_ref.actor.optim.lr=1e999", *CFG_JOB],
     "actor_rollout_ref.actor.optim.lr=inf is invalid: must be a finite number >= 0."),
    ("main_sft", [*CFG_JOB, "custom_reward_function.path=/tmp"],
     "custom_reward_function.path='/tmp' is a folder, not a file; point it at a .py file or set it to null."),
])
def test_cfg_job_refusals_from_the_command_line(module, args, expected, tmp_path):
    """Real processes, flags before or after the settings."""
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run([sys.executable, "-m", f"hybrid_rl.trainer.{module}", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.stdout == ""
    assert _one_line(result.returncode, result.stderr).startswith(expected)
