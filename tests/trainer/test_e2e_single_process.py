"""The one-worker CLI run in the driver's process (trainer.single_process) against the same run
through a Ray actor: the same metrics and the same weights, bit for bit; a quiet console."""

import math
import os
import subprocess
import sys

import pytest
import torch
from test_e2e import REPO, _assert_ok, _overrides, _rows, _weights

pytestmark = pytest.mark.slow

VARYING = ("timing", "perf/", "time", "throughput")
"""Metric keys that measure the machine, not the computation."""


def _computed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(part in k for part in VARYING)}


@pytest.mark.vllm
def test_single_process_equals_the_ray_run_bit_for_bit(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    dropped = ("actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=3",
               "actor_rollout_ref.rollout.dtype=float32")
    runs = {}
    for mode in ("true", "false"):
        out = tmp_path / mode
        out.mkdir()
        overrides = [o for o in _overrides(out, tiny_model_dir) if o not in dropped]
        overrides += ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.val_before_train=false",
                      "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.cpu_kvcache_space_gib=1",
                      "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.04",
                      f"trainer.single_process={mode}"]
        result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=out,
                                env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=900)
        _assert_ok(result)
        runs[mode] = (out / "run", result)
    (single, single_result), (ray_run, _) = runs["true"], runs["false"]
    rows_single, rows_ray = _rows(single), _rows(ray_run)
    assert [r["step"] for r in rows_single] == [1, 2]
    for a, b in zip(rows_single, rows_ray):
        a, b = _computed(a), _computed(b)
        assert a.keys() == b.keys()
        for key in a:
            same = a[key] == b[key] or (isinstance(a[key], float) and math.isnan(a[key]) and math.isnan(b[key]))
            assert same, (key, a[key], b[key])
    assert math.isfinite(rows_single[-1]["actor/pg_loss"])
    w_single, w_ray = _weights(single / "global_step_2"), _weights(ray_run / "global_step_2")
    assert w_single and w_ray, "no model*.safetensors written at global_step_2"  # {} == {} would pass below
    assert w_single.keys() == w_ray.keys() and all(torch.equal(w_single[k], w_ray[k]) for k in w_single)
    # Quiet console: the worker's and vLLM's start-up lines went to the log file only.
    console = single_result.stdout + single_result.stderr
    assert "vLLM rollout engine ready" not in console and "joined the gloo process group" not in console
    log = (single / "logs" / "driver.log").read_text()
    assert "built Colocated_actor_rollout in the driver's process" in log and "vLLM rollout engine ready" in log
    assert not (ray_run / "logs" / "driver.log").read_text().count("in the driver's process")
    assert os.path.exists(ray_run / "logs" / "worker_0.log")
