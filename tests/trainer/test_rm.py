"""``python -m hybrid_rl.trainer.main_rm``: key translation, pairwise accuracy rising, the exported
folder scoring like the worker under plain transformers, bit-exact resume after SIGKILL, one-line
bad input."""

import json
import os
import subprocess
import sys

import pytest
import torch

from hybrid_rl.trainer.config.supervised import RMConfig, rm_critic_config
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.main_rm import rm_config
from tests.trainer.test_e2e import REPO, _weights


def test_rm_keys_build_the_reward_model_workers_config(tmp_path):
    cfg = rm_config(["model.partial_pretrain=/sft", "optim.lr=2e-5", "data.train_batch_size=8",
                     "data.micro_batch_size_per_gpu=2", "data.chosen_key=good"])
    assert isinstance(cfg, RMConfig) and cfg.trainer.experiment_name == "reward_model" and cfg.data.chosen_key == "good"
    worker = rm_critic_config(cfg)
    assert worker.model.path == "/sft" and worker.optim.lr == 2e-5 and worker.ppo_micro_batch_size_per_gpu == 2
    assert worker.ppo_mini_batch_size == 8 and worker.rollout_n == 1  # one optimizer step per batch of pairs
    assert rm_config([]).data.micro_batch_size_per_gpu == 8
    train, val = supervised_data_files(rm_config([f"data.arithmetic.cache_dir={tmp_path}"]).data, "pairs")
    assert os.path.isfile(train[0]) and train[0].endswith("pairs_train.parquet")
    with pytest.raises(ValueError, match="Unknown config key 'critic.optim.lr'.*main_rm --help"):  # no PPO keys
        rm_config(["critic.optim.lr=1e-5"])


def _rm(tmp_path, model_dir, run, *extra, env=None):
    args = [f"model.partial_pretrain={model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
            "data.arithmetic.num_test=8", "data.train_batch_size=8", "data.micro_batch_size_per_gpu=3",
            "model.fsdp_config.mixed_precision.param_dtype=float32", "optim.lr=1e-3",
            "trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.save_freq=2",
            "trainer.progress_bar=false", f"trainer.default_local_dir={tmp_path}/{run}", "ray_init.num_cpus=2", *extra]
    return subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_rm", *args], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=REPO, **(env or {})), capture_output=True, text=True,
                          timeout=900)


def _hf_pair_scores(folder, pairs_file):
    """Scores of every pair with a plain ``AutoModelForSequenceClassification`` forward, one row at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hybrid_rl.data.preference import load_preference_pairs

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    scores = []
    for pair in load_preference_pairs(pairs_file):
        row = []
        for response in (pair.chosen, pair.rejected):
            text = tokenizer.apply_chat_template(pair.prompt + [{"role": "assistant", "content": response}],
                                                 tokenize=False)
            ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
            with torch.no_grad():
                row.append(float(model(input_ids=ids).logits[0, 0]))
        scores.append(row)
    return torch.tensor(scores)  # [N, 2]


@pytest.mark.slow
def test_rm_learns_exports_and_resumes_bit_exactly(tmp_path, tiny_model_dir):
    from hybrid_rl.model_merger import merge_checkpoint

    result = _rm(tmp_path, tiny_model_dir, "run")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    val = [r for r in rows if "val/rm/accuracy" in r]
    assert len(val) == 3  # before training, steps 2 and 4
    assert val[-1]["val/rm/loss"] < val[0]["val/rm/loss"] and val[-1]["val/rm/accuracy"] > val[0]["val/rm/accuracy"]
    assert sum("train/loss" in r for r in rows) == 4
    # one CPU worker from the command line: in the driver's process, as main_ppo's (no Ray started)
    log = (tmp_path / "run" / "logs" / "driver.log").read_text()
    assert "in the driver's process" in log and "started a local Ray instance" not in log
    # the export: AutoModelForSequenceClassification, scoring as the worker did, with the score statistics
    folder = merge_checkpoint(str(tmp_path / "run" / "global_step_4" / "reward_model"), str(tmp_path / "hf"))
    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert config["mean"] == pytest.approx(val[-1]["val/rm/score_mean"], rel=1e-6)
    assert config["std"] == pytest.approx(val[-1]["val/rm/score_std"], rel=1e-6)
    pairs_file = next((tmp_path / "data").glob("rlhf-*/pairs_test.parquet"))
    scores = _hf_pair_scores(folder, pairs_file)
    assert float(scores[:, 0].mean()) == pytest.approx(val[-1]["val/rm/chosen_mean"], abs=1e-4)
    assert float(scores[:, 1].mean()) == pytest.approx(val[-1]["val/rm/rejected_mean"], abs=1e-4)
    assert float((scores[:, 0] > scores[:, 1]).float().mean()) == val[-1]["val/rm/accuracy"]
    from hybrid_rl.data.preference import load_preference_pairs
    from hybrid_rl.data.rlhf_data import REJECTED_KINDS

    kinds = [pair.kind for pair in load_preference_pairs(pairs_file)]
    assert set(kinds) == set(REJECTED_KINDS)
    for kind in REJECTED_KINDS:  # the accuracy per rejected kind, as the plain forward sees it
        rows = torch.tensor([k == kind for k in kinds])
        assert float((scores[rows, 0] > scores[rows, 1]).float().mean()) == val[-1][f"val/rm/accuracy/{kind}"]
    # SIGKILL before step 3's update, rerun: the same step-4 weights as the uninterrupted run
    env = {"HYBRID_RL_FAULT": "kill:driver.update_reward_model:3", "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    assert _rm(tmp_path, tiny_model_dir, "killed", env=env).returncode != 0
    resumed = _rm(tmp_path, tiny_model_dir, "killed", env=env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    want = _weights(tmp_path / "run" / "global_step_4", "reward_model")
    got = _weights(tmp_path / "killed" / "global_step_4", "reward_model")
    assert want and want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_bad_rm_input_is_one_line(tmp_path, tiny_model_dir):
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "preferred": "a", "rejected": "b"}) + "\n")
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_rm", f"data.train_files={rows}",
                             f"model.partial_pretrain={tiny_model_dir}", "data.train_batch_size=1"],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"hybrid_rl config error: {rows}, row 1: no 'chosen' column (columns: ['preferred', 'prompt', 'rejected']). "
        "Fix: name the column with data.chosen_key= (OpenRLHF --chosen_key, TRL 'chosen'/'rejected').")
