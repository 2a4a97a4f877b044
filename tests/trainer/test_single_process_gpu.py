"""A one-GPU run with its worker in the driver's process (no Ray): chosen automatically, trains, and
resumes from its checkpoint. Runs where CUDA is (``pytest -m gpu``), Ray installed or not."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(out, model_dir, *extra):
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}", f"data.arithmetic.cache_dir={out}/data",
        "data.arithmetic.num_train=48", "data.arithmetic.num_test=4", "data.arithmetic.num_shots=0",
        "data.max_prompt_length=160", "data.max_response_length=8", "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_kl_loss=true", "trainer.device=cuda", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=1", "trainer.logger=[jsonl]", "trainer.progress_bar=false",
        "trainer.plot=false", f"trainer.default_local_dir={out}/run",
        # an eager decode: this test is about the run in one process; gpu_check's `ours` times the compiled one
        "actor_rollout_ref.rollout.enforce_eager=true", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), REPO]))}
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=out, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def _rows(out):
    path = next((out / "run").rglob("metrics.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(240)  # two runs of a process each (start-up, one or two steps, a checkpoint)
def test_one_gpu_runs_in_the_drivers_process_and_resumes(tmp_path, tiny_model_dir):
    _run(tmp_path, tiny_model_dir, "trainer.total_training_steps=1")
    log = (tmp_path / "run" / "logs" / "driver.log").read_text()
    assert "in the driver's process" in log, log[-2000:]
    _run(tmp_path, tiny_model_dir, "trainer.total_training_steps=2", "trainer.resume_mode=auto")
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows][-1] == 2
    assert all(r["actor/pg_loss"] == r["actor/pg_loss"] for r in rows)  # finite, not NaN
