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


def test_hf_folder_and_its_checkpoint_evaluate_the_same(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_rl.workers.checkpoint import save_checkpoint

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    step = tmp_path / "run" / "global_step_2"
    save_checkpoint(str(step / "actor"), model=model, hf_config=model.config, tokenizer=tok, contents=("model",),
                    state_dict_type="full", global_step=2)
    out = tmp_path / "eval" / "hf.json"
    from_folder = main(["--model", tiny_model_dir, "--n", "2", "--engine", "hf", "--output", str(out), *_task(tmp_path)])
    from_ckpt = main(["--model", str(step), "--n", "2", "--engine", "hf", *_task(tmp_path)])
    assert from_folder["rows"] == 6 and from_folder["n"] == 2
    row = from_folder["table"]["arithmetic"]
    assert set(row) == {"mean@2", "pass@1", "pass@2", "best@2"} and 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
    assert row["mean@2"] <= row["best@2"] <= row["pass@2"]  # with replacement: between the two
    assert from_ckpt["table"] == from_folder["table"]  # the same weights, the same seeded samples
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
