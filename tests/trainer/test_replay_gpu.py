"""A step recorded on CPU replayed on a GPU (``--device cuda``): no rollout engine, other kernels.
Runs where CUDA is (``pytest -m gpu``)."""

import json
import math
import os

import pytest
import torch

from hybrid_rl.trainer import get_config, run_ppo
from hybrid_rl.trainer.core import batch_file
from hybrid_rl.trainer.ppo.replay import format_report, replay_step
from test_replay import LEARNED, PINNED, recorded_overrides

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.timeout(600)
def test_a_cpu_recorded_step_replays_on_cuda(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(batch_file, "code_identity", lambda: dict(PINNED))
    overrides = recorded_overrides(tmp_path, tiny_model_dir, "trainer.device=cpu")
    run_ppo(get_config(overrides))
    report = replay_step(str(tmp_path / "run"), 2, overrides, device="cuda")
    text = format_report(report)
    print(text)
    if os.environ.get("OUT"):  # the device run brings the report back
        with open(os.path.join(os.environ["OUT"], "replay_cuda.json"), "w") as f:
            json.dump(report, f, indent=1)
    assert report["device"] == "cuda" and report["recorded_device"] == "cpu"
    assert "small differences are expected here, not a failure" in text and "NOT bit-identical" not in text
    for key in LEARNED:
        m = report["metrics"][key]
        assert math.isfinite(m["replayed"]), key
        assert abs(m["replayed"] - m["recorded"]) <= 0.05 * abs(m["recorded"]) + 1e-4, (key, m)
    # Adam moves each weight by about lr (1e-3) per optimizer step: two steps, twice that at most
    assert report["weights"]["actor"]["max_abs_diff"] < 5e-3
