"""``python -m hybrid_rl.eval``: the trainer's validation, standalone, for an HF folder or a checkpoint."""

import json
import subprocess
import sys

import pytest

from hybrid_rl.eval import main, resolve_eval_model, table

pytestmark = pytest.mark.slow


def _task(tmp_path):
    return [f"data.arithmetic.cache_dir={tmp_path}/data", "data.arithmetic.num_train=8", "data.arithmetic.num_test=6",
            "data.arithmetic.num_shots=0", "data.max_prompt_length=160", "data.max_response_length=8",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.dtype=float32", "ray_init.num_cpus=2"]


@pytest.fixture(scope="module", autouse=True)
def _ray_down_after_module():
    yield
    import ray

    ray.shutdown()


RECORDING_REWARD = """
import json, os


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    with open(os.environ["EVAL_RESPONSES"], "a", encoding="utf-8") as f:  # one short line: an atomic append
        f.write(json.dumps([ground_truth, solution_str]) + "\\n")
    return (sum(map(ord, solution_str)) % 7 + 1) / 7.0  # > 0 and varies with the text
"""


def _evaluate(tmp_path, monkeypatch, name, model, *args):
    """``main`` on ``model`` with a reward that records every (ground truth, response) it scores;
    returns the result and the sorted records."""
    log = tmp_path / f"{name}.responses.jsonl"
    monkeypatch.setenv("EVAL_RESPONSES", str(log))
    reward = tmp_path / "recording_reward.py"
    reward.write_text(RECORDING_REWARD)
    result = main(["--model", model, "--n", "2", "--engine", "hf", *args, *_task(tmp_path),
                   f"custom_reward_function.path={reward}"])
    return result, sorted(json.loads(line) for line in log.read_text().splitlines())


def test_hf_folder_and_its_checkpoint_evaluate_the_same(tmp_path, tiny_model_dir, monkeypatch):
    """The same weights give the same sampled responses, token for token, and the same table; a
    checkpoint of other weights gives other responses (so the comparison sees which weights loaded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_rl.workers.checkpoint import save_checkpoint

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    step = tmp_path / "run" / "global_step_2"
    save_checkpoint(str(step / "actor"), model=model, hf_config=model.config, tokenizer=tok, contents=("model",),
                    state_dict_type="full", global_step=2)
    with torch.no_grad():  # other weights: the embeddings scaled
        model.get_input_embeddings().weight.mul_(3.0)
    other = tmp_path / "run" / "global_step_3"
    save_checkpoint(str(other / "actor"), model=model, hf_config=model.config, tokenizer=tok, contents=("model",),
                    state_dict_type="full", global_step=3)
    out = tmp_path / "eval" / "hf.json"
    from_folder, said_folder = _evaluate(tmp_path, monkeypatch, "folder", tiny_model_dir, "--output", str(out))
    from_ckpt, said_ckpt = _evaluate(tmp_path, monkeypatch, "ckpt", str(step))
    _, said_other = _evaluate(tmp_path, monkeypatch, "other", str(other))
    assert from_folder["rows"] == 6 and from_folder["n"] == 2
    row = from_folder["table"]["arithmetic"]
    assert set(row) == {"mean@2", "pass@1", "pass@2", "best@2"} and 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
    assert row["mean@2"] <= row["best@2"]
    assert row["mean@2"] > 0  # the recording reward scores every response above 0: not an all-zero table
    # every one of the 6 x 2 sampled responses, the same text from the folder and from its checkpoint
    assert len(said_folder) == 12 and any(response for _, response in said_folder)
    assert said_ckpt == said_folder and from_ckpt["table"] == from_folder["table"]
    assert len(said_other) == 12 and said_other != said_folder  # other weights: other responses
    assert json.loads(out.read_text())["table"] == from_folder["table"]


def test_table_groups_metrics_per_source():
    metrics = {"val-core/a/reward/mean@4": 0.5, "val-core/a/reward/pass@4": 0.75, "val-core/b/c/reward/mean@4": 0.1,
               "val-aux/response_length/mean": 9.0}
    assert table(metrics) == {"a": {"mean@4": 0.5, "pass@4": 0.75}, "b/c": {"mean@4": 0.1}}
    verl = {"val-core/a/reward/best@4/mean": 0.9, "val-core/a/acc/maj@4/mean": 0.6, "val-core/a/acc/mean@4": 0.5,
            "val-aux/a/reward/best@2/mean": 0.7, "val-aux/a/reward/std@4": 0.2}
    assert table({**metrics, **verl})["a"] == {"mean@4": 0.5, "pass@4": 0.75, "best@4": 0.9, "acc/maj@4": 0.6,
                                               "acc/mean@4": 0.5}


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "global_step_1").mkdir()
    (tmp_path / "global_step_1" / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match="without actor/checkpoint_meta.json"):
        resolve_eval_model(str(tmp_path / "global_step_1"), str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.eval", "--model", "x", "--data", "missing.parquet"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--data missing.parquet: no such file" in result.stderr
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.eval", "--model", "x", "--n", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: --n 0")
