"""benchmarks/profile_update.py: the smoke run profiles both passes and finds every attention call."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from profile_update import attribute, device_kernels, idle_intervals, main, union_busy  # noqa: E402


def test_profile_smoke_run_counts_the_packed_attention_calls(tmp_path):
    result = main(["--device", "cpu", "--model", "tiny", "--rows", "8", "--n", "4", "--prompt-len", "8",
                   "--response-len", "8", "--attn", "sdpa", "--fsdp", "--json", str(tmp_path / "p.json"),
                   "--trace", str(tmp_path / "trace")])
    assert result["kernels"] == {"rows": "sdpa", "groups": "sdpa"}
    for name in ("ref", "update_actor", "update_actor_fsdp2_per_layer", "update_actor_fsdp2_root"):
        figures = result[name]
        assert figures["attention_calls"] == 2  # the tiny model's 2 layers x one micro-batch, forward
        assert 0 < figures["attention_s"] < figures["wall_s"] and figures["kernel_launches"] > 0
        assert (tmp_path / "trace" / f"{name}.json").is_file()
        phases = figures["host_phases_s"]
        assert {"inputs", "model", "packed_attention", "log_probs"} <= set(phases)
        assert phases["packed_attention"] <= phases["model"] < figures["wall_s"]
    assert {"loss", "backward", "optimizer_step", "metrics"} <= set(result["update_actor"]["host_phases_s"])
    assert "backward" not in result["ref"]["host_phases_s"]
    assert (tmp_path / "p.json").is_file()


def test_gpu_annotations_are_not_counted_as_kernels():
    from types import SimpleNamespace

    def event(name, device, annotation=False):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), is_user_annotation=annotation)

    events = [event("ampere_bf16_gemm", "CUDA"), event("FSDP::post_backward_reduce", "CUDA", True),
              event("Optimizer.step#AdamW.step", "CUDA", True), event("hybrid_rl/model", "CUDA"),
              event("aten::mm", "CPU"), event("flash_fwd_kernel", "CUDA")]
    assert [e.name for e in device_kernels(events)] == ["ampere_bf16_gemm", "flash_fwd_kernel"]


def test_busy_intervals_merge_and_idle_is_their_complement():
    busy = [(5.0, 7.0), (1.0, 3.0), (2.0, 4.0), (7.0, 8.0)]
    assert union_busy(busy) == [(1.0, 4.0), (5.0, 8.0)]
    assert idle_intervals(busy, 0.0, 10.0) == [(0.0, 1.0), (4.0, 5.0), (8.0, 10.0)]
    assert idle_intervals(busy, 2.0, 6.0) == [(4.0, 5.0)]
    assert idle_intervals([], 0.0, 2.0) == [(0.0, 2.0)]


def test_idle_time_goes_to_the_innermost_open_range():
    # host: model [0, 10) holding attention [2, 4); loss [10, 12); nothing after 12
    ranges = [(0.0, 10.0, "model"), (2.0, 4.0, "packed_attention"), (10.0, 12.0, "loss")]
    gaps = [(1.0, 3.0), (9.0, 11.0), (11.5, 14.0)]
    result = attribute(gaps, ranges)
    assert result == {"unlabelled": 2.0, "loss": 1.5, "model": 2.0, "packed_attention": 1.0}
    assert list(result.values()) == sorted(result.values(), reverse=True)  # largest first
    assert attribute([], ranges) == {}
    assert sum(attribute(gaps, ranges).values()) == sum(b - a for a, b in gaps)


def test_an_unknown_phase_is_refused_in_one_line():
    from hybrid_rl.utils.profiling import PHASES, phase

    with pytest.raises(ValueError, match="unknown profiler phase 'forward'"):
        phase("forward")
    assert "packed_attention" in PHASES
