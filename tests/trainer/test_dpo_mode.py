"""``python -m hybrid_rl.trainer.main_dpo``: its keys, checks and steps' batch keys, the held-out pair
metrics by hand, a tiny-model run with trainer.check_batch on, bit-exact resume after SIGKILL, and
one-line bad input."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.dpo.checks import dpo_plan, validate_dpo_config
from hybrid_rl.trainer.dpo.config import DPOConfig, dpo_actor_config, dpo_objective
from hybrid_rl.trainer.dpo.contracts import dpo_batch_plan
from hybrid_rl.trainer.dpo.validation import held_out_pair_metrics
from hybrid_rl.trainer.main_dpo import dpo_config
from hybrid_rl.trainer.modes import CONFIG_ERROR_EXIT_CODE, run_mode
from tests.trainer.mode_runs import assert_resumes_bit_exactly, launcher
from tests.trainer.test_e2e import REPO


def test_dpo_keys_build_the_actor_workers_config():
    cfg = dpo_config(["model.partial_pretrain=/sft", "optim.lr=5e-7", "data.train_batch_size=8",
                      "data.micro_batch_size_per_gpu=2", "data.use_dynamic_bsz=false", "dpo.beta=0.2",
                      "dpo.loss_type=robust", "dpo.label_smoothing=0.1", "model.lora_rank=8"])
    assert isinstance(cfg, DPOConfig) and cfg.trainer.experiment_name == "dpo" and cfg.data.chosen_key == "chosen"
    arr = dpo_actor_config(cfg)
    assert arr.model.path == "/sft" and arr.model.lora_rank == 8 and arr.actor.optim.lr == 5e-7
    assert arr.actor.ppo_mini_batch_size == 16 and arr.actor.ppo_micro_batch_size_per_gpu == 4  # 2 rows a pair
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 4 and not arr.ref.log_prob_use_dynamic_bsz
    assert arr.actor.objective == {"name": "dpo", "beta": 0.2, "loss_type": "robust", "label_smoothing": 0.1,
                                   "simpo_gamma": 0.5, "reference_free": False}
    assert arr.actor.ppo_epochs == 1 and not arr.actor.shuffle and arr.rollout.n == 1
    assert cfg.rollout.response_length == cfg.data.max_response_length == 16  # the held-out answers' length follows


@pytest.mark.parametrize("overrides, reference", [([], True), (["dpo.loss_type=simpo"], False),
                                                  (["dpo.reference_free=true"], False)])
def test_the_reference_is_built_and_run_only_when_the_loss_reads_it(overrides, reference):
    cfg = dpo_config(overrides)
    assert dpo_plan(cfg).use_reference_policy is reference
    plan = dpo_batch_plan(dpo_objective(cfg), reference)
    plan.check()
    names = [step.name for step in plan.steps]
    assert names == (["compute_ref_log_prob"] if reference else []) + ["update_actor"]
    assert ("ref_log_prob" in plan.contract("update_actor").reads) is reference


def test_a_plan_without_the_reference_pass_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"step update_actor needs batch key 'ref_log_prob' that no earlier step "
                                         r"produces .*declared in hybrid_rl/trainer/dpo/contracts.py"):
        dpo_batch_plan(dpo_objective(dpo_config()), with_reference=False).check()


@pytest.mark.parametrize("overrides, message", [
    (["dpo.beta=0"], r"^dpo.beta must be > 0, got 0.0. Fix: set a positive value \(TRL's default is 0.1\).$"),
    (["dpo.loss_type=kto"], r"^dpo.loss_type='kto' is not a DPO loss type; valid: "),
    (["dpo.loss_type=hinge", "dpo.label_smoothing=0.1"], r"^dpo.label_smoothing=0.1 has no effect with loss_type='hinge'"),
    (["data.max_token_len_per_gpu=1500"], r"^data.max_token_len_per_gpu=1500 is smaller than one pair of up to 2 x "
                                          r"data.max_length=1024 tokens .* at least 2048.$"),
    (["data.max_prompt_length=1024"], r"^data.max_prompt_length=1024 leaves no room for a response"),
    (["data.truncation=middle"], r"^data.truncation='middle' must be one of"),
    (["rollout.n=4"], r"^rollout.n=4: offline DPO samples no responses"),
    (["trainer.n_gpus_per_node=2", "ray_init.num_cpus=2", "data.train_batch_size=3"],
     r"^data.train_batch_size=3 must be a positive multiple of the 2 workers"),
])
def test_dpo_checks_name_its_own_keys(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_dpo_config(dpo_config(overrides))


def test_help_lists_the_dpo_keys_and_cfg_job_prints_them(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_mode("dpo", ["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m hybrid_rl.trainer.main_dpo [key=value ...]")
    for line in ("  dpo.beta=0.1\n", "  dpo.loss_type=sigmoid\n", "  dpo.reference_free=false\n",
                 "  data.chosen_key=chosen\n", "  data.train_batch_size=16\n      Pairs per optimizer step"):
        assert line in out
    run_mode("dpo", ["--cfg", "job", "dpo.beta=0.25", "dpo.loss_type=ipo", f"data.arithmetic.cache_dir={tmp_path}"])
    assert "dpo:\n  beta: 0.25\n  loss_type: ipo\n" in capsys.readouterr().out


def test_a_users_yaml_names_the_dpo_schema(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_dpo.yaml").write_text("defaults:\n  - dpo_trainer_schema\n  - _self_\n"
                                          "dpo:\n  beta: 0.3\n  loss_type: hinge\n")
    run_mode("dpo", ["--config-path", str(tmp_path), "--config-name", "my_dpo", "--cfg", "job",
                     f"data.arithmetic.cache_dir={tmp_path}"])
    assert "dpo:\n  beta: 0.3\n  loss_type: hinge\n" in capsys.readouterr().out


def test_a_misspelt_key_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_mode("dpo", ["dpo.loss_typ=ipo"])
    assert exit_info.value.code == CONFIG_ERROR_EXIT_CODE
    assert capsys.readouterr().err == (
        "hybrid_rl config error: Unknown config key 'dpo.loss_typ'. Did you mean 'dpo.loss_type'? All keys are listed "
        "in python -m hybrid_rl.trainer.main_dpo --help (documented in hybrid_rl/trainer/config/).\n")


def test_held_out_pair_metrics_by_hand():
    """Two batches, three pairs, one response token each: sequence log-probs are the tokens' own."""
    cfg = dpo_config(["dpo.beta=0.5"])

    def batch(policy, ref):
        mask = torch.ones(len(policy), 1)
        return DataProto.from_dict({"response_mask": mask, "old_log_probs": torch.tensor(policy).unsqueeze(1),
                                    "ref_log_prob": torch.tensor(ref).unsqueeze(1)})

    batches = [batch([-1.0, -3.0], [-2.0, -2.0]), batch([-2.0, -1.0, -4.0, -4.0], [-2.0, -2.0, -3.0, -3.0])]
    got = held_out_pair_metrics(dpo_objective(cfg), batches, lambda b: b.batch["old_log_probs"],
                                lambda b: b.batch["ref_log_prob"])
    # rewards 0.5 * (policy - ref): pair 1 (+0.5, -0.5), pair 2 (0, +0.5), pair 3 (-0.5, -0.5)
    chosen, rejected = [0.5, 0.0, -0.5], [-0.5, 0.5, -0.5]
    margins = [c - r for c, r in zip(chosen, rejected)]  # 1, -0.5, 0
    assert got["val/dpo/rewards/accuracies"] == pytest.approx(1 / 3)  # ties are not accurate (TRL's >)
    assert got["val/dpo/rewards/margins"] == pytest.approx(sum(margins) / 3)
    assert got["val/dpo/rewards/chosen"] == pytest.approx(0.0) and got["val/dpo/rewards/rejected"] == pytest.approx(-0.5 / 3)
    assert got["val/dpo/logps/chosen"] == pytest.approx((-1 - 2 - 4) / 3)
    assert got["val/dpo/loss"] == pytest.approx(sum(math.log1p(math.exp(-m)) for m in margins) / 3)


_dpo = launcher("main_dpo", "data.max_prompt_length=160", "data.max_response_length=8", "data.max_length=200",
                "data.max_token_len_per_gpu=1024", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2",
                "rollout.name=hf", "rollout.dtype=float32", "trainer.total_training_steps=2", "trainer.test_freq=2",
                "trainer.save_freq=1", "trainer.val_before_train=true", "trainer.check_batch=true")


@pytest.mark.slow
def test_a_two_step_run_checks_its_batches_raises_held_out_accuracy_and_resumes_bit_exactly(tmp_path, tiny_model_dir):
    result = _dpo(tmp_path, tiny_model_dir, "run")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    first, second = rows[1], rows[2]
    assert first["dpo/loss"] == pytest.approx(math.log(2), abs=1e-5)  # the policy is the reference at step 1
    assert first["dpo/rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert all(r["train/loss"] == r["dpo/loss"] and r["train/pairs"] == 4 for r in (first, second))
    assert second["dpo/loss"] < first["dpo/loss"]
    assert rows[2]["val/dpo/rewards/accuracies"] > rows[0]["val/dpo/rewards/accuracies"]
    assert "val-core/arithmetic/reward/mean@1" in rows[0] and "val-core/arithmetic/reward/mean@1" in rows[2]
    ppo_names = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy"}
    assert not ppo_names & {k for r in rows for k in r}, "a DPO run logs PPO metrics"
    log = (tmp_path / "run" / "logs" / "driver.log").read_text()
    assert "checked at every step boundary against hybrid_rl/trainer/dpo/contracts.py" in log
    assert_resumes_bit_exactly(_dpo, tmp_path, tiny_model_dir, "kill:driver.update_actor:2", 2)


@pytest.mark.slow
def test_a_reference_free_run_builds_and_runs_no_reference(tmp_path, tiny_model_dir):
    result = _dpo(tmp_path, tiny_model_dir, "simpo", "dpo.loss_type=simpo", "dpo.beta=2.0", "data.use_dynamic_bsz=false",
                  "trainer.save_freq=-1")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in open(tmp_path / "simpo" / "metrics.jsonl")]
    keys = {k for r in rows for k in r}
    assert not {"timing_s/compute_ref_log_prob", "perf/peak_rss_gib/ref"} & keys  # no reference pass, no reference
    assert rows[2]["dpo/loss"] < rows[1]["dpo/loss"] and "val/dpo/rewards/margins" in rows[2]


@pytest.mark.parametrize("extra, message", [
    ([], "{rows}, row 3: no 'rejected' column (columns: ['chosen', 'prompt']). Fix: name the column with "
         "data.rejected_key= (OpenRLHF --rejected_key, TRL 'chosen'/'rejected')."),
    (["data.bad_rows=skip", "data.max_bad_fraction=0.1"],
     "data.bad_rows=skip: left out 1 of 3 preference pairs (33.33%) - 1 no 'rejected'. First: pairs.jsonl row 3: "
     "no 'rejected'. That is more than data.max_bad_fraction=0.1: check the column mapping (data.prompt_key, ...) "
     "or clean the files, or raise data.max_bad_fraction."),
])
def test_bad_pairs_are_one_line(tmp_path, tiny_model_dir, extra, message):
    rows = tmp_path / "pairs.jsonl"
    good = {"prompt": "What is 1 + 1?", "chosen": "#### 2", "rejected": "#### 3"}
    rows.write_text("".join(json.dumps(r) + "\n" for r in (good, good, {"prompt": "q", "chosen": "a"})))
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_dpo", f"data.train_files={rows}",
                             f"model.partial_pretrain={tiny_model_dir}", "data.train_batch_size=1",
                             f"trainer.default_local_dir={tmp_path}/run", *extra],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "hybrid_rl config error: " + message.format(rows=rows)
