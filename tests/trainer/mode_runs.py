"""What the supervised modes' end-to-end tests share: a short run of an entry point on the tiny model,
and the kill-and-resume check that the resumed run's weights equal the uninterrupted run's."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.trainer.test_e2e import REPO, _weights


def run_entry(entry: str, tmp_path, model_dir, run: str, *args: str, env=None) -> subprocess.CompletedProcess:
    """``python -m hybrid_rl.trainer.<entry>`` on ``model_dir`` and the arithmetic task (8 held-out
    problems), float32, lr 1e-3, writing to ``tmp_path/run``; ``args`` come last (they win)."""
    common = [f"model.partial_pretrain={model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
              "data.arithmetic.num_test=8", "model.fsdp_config.mixed_precision.param_dtype=float32", "optim.lr=1e-3",
              "trainer.progress_bar=false", f"trainer.default_local_dir={tmp_path}/{run}", "ray_init.num_cpus=2"]
    return subprocess.run([sys.executable, "-m", f"hybrid_rl.trainer.{entry}", *common, *args], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=REPO, **(env or {})), capture_output=True, text=True,
                          timeout=900)


def launcher(entry: str, *mode_args: str):
    """``launch(tmp_path, model_dir, run, *extra, env=None)``: :func:`run_entry` of ``entry`` with
    ``mode_args``, then ``extra`` (they win)."""

    def launch(tmp_path, model_dir, run: str, *extra: str, env=None) -> subprocess.CompletedProcess:
        return run_entry(entry, tmp_path, model_dir, run, *mode_args, *extra, env=env)

    return launch


def assert_resumes_bit_exactly(launch, tmp_path, model_dir, fault: str, step: int, part: str = "actor") -> None:
    """``launch(tmp_path, model_dir, run, env=...)`` killed at ``fault`` (``kill:driver.<point>:<step>``)
    and rerun as run ``killed`` ends with the weights of run ``run`` at ``global_step_<step>``."""
    env = {"HYBRID_RL_FAULT": fault, "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    assert launch(tmp_path, model_dir, "killed", env=env).returncode != 0
    resumed = launch(tmp_path, model_dir, "killed", env=env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    want = _weights(tmp_path / "run" / f"global_step_{step}", part)
    got = _weights(tmp_path / "killed" / f"global_step_{step}", part)
    assert want and got, f"no model*.safetensors written at global_step_{step}"  # {} == {} would pass below
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
