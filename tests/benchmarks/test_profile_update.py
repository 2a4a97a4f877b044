"""benchmarks/profile_update.py: the smoke run profiles both passes and finds every attention call."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from profile_update import main  # noqa: E402


def test_profile_smoke_run_counts_the_packed_attention_calls(tmp_path):
    result = main(["--device", "cpu", "--model", "tiny", "--rows", "8", "--n", "4", "--prompt-len", "8",
                   "--response-len", "8", "--attn", "sdpa", "--json", str(tmp_path / "p.json"),
                   "--trace", str(tmp_path / "trace")])
    assert result["kernels"] == {"rows": "sdpa", "groups": "sdpa"}
    for name in ("ref", "update_actor"):
        figures = result[name]
        assert figures["attention_calls"] == 2  # the tiny model's 2 layers x one micro-batch, forward
        assert 0 < figures["attention_s"] < figures["wall_s"] and figures["kernel_launches"] > 0
        assert (tmp_path / "trace" / f"{name}.json").is_file()
    assert (tmp_path / "p.json").is_file()
