"""dtype ``auto``: one decision per device, forced both ways, cached per machine; explicit values win."""

import json
import os
import platform
import subprocess
import sys

import pytest

from hybrid_rl.utils import precision as P

FAST = P.CpuBf16Profile(isa="AVX512+amx", native=True, fp32_gflops=400.0, bf16_gflops=2800.0)
EMULATED = P.CpuBf16Profile(isa="AVX2", native=False, fp32_gflops=180.0, bf16_gflops=0.9)
NO_BF16_UNITS = P.CpuBf16Profile(isa="AVX512", native=False, fp32_gflops=190.0, bf16_gflops=60.0)
FLAGS_BUT_SLOW = P.CpuBf16Profile(isa="AVX512+avx512_bf16", native=True, fp32_gflops=190.0, bf16_gflops=200.0)


@pytest.fixture
def profile(monkeypatch):
    """Force the CPU profile (and forget cached decisions) for one test."""
    P.auto_dtype.cache_clear()

    def use(p: P.CpuBf16Profile) -> None:
        P.auto_dtype.cache_clear()
        monkeypatch.setattr(P, "cpu_bf16_profile", lambda: p)

    yield use
    P.auto_dtype.cache_clear()


def test_canonical_names_and_bad_name():
    assert [P.canonical_dtype(n) for n in ("bf16", "fp32", "fp16", "auto", "bfloat16")] == \
        ["bfloat16", "float32", "float16", "auto", "bfloat16"]
    with pytest.raises(ValueError, match="float8"):
        P.canonical_dtype("float8")


@pytest.mark.parametrize("cpu, expected", [(FAST, "bfloat16"), (EMULATED, "float32"), (NO_BF16_UNITS, "float32"),
                                           (FLAGS_BUT_SLOW, "float32")])
def test_auto_on_cpu_follows_flags_and_probe(profile, cpu, expected):
    profile(cpu)
    assert P.resolve_dtype("auto", "cpu") == expected
    assert P.resolve_dtype("auto", "cpu", "rollout") == expected
    assert cpu.isa in P.auto_dtype("cpu").reason


@pytest.mark.parametrize("cpu", [FAST, EMULATED])
def test_explicit_values_are_honoured(profile, cpu):
    profile(cpu)
    assert P.resolve_dtype("bf16", "cpu") == "bfloat16"
    assert P.resolve_dtype("float32", "cpu") == "float32"


def test_auto_on_cuda(monkeypatch, profile):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    # V100/T4: torch reports bf16 as supported *with emulation*; auto must not count that.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    profile(FAST)
    # fp16 training would need loss scaling: fp32; the rollout casts to fp16 as vLLM does.
    assert P.resolve_dtype("auto", "cuda") == "float32"
    assert P.resolve_dtype("auto", "cuda:0", "rollout") == "float16"
    P.auto_dtype.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert P.resolve_dtype("auto", "cuda") == "bfloat16"


def test_slow_bf16_warning_names_keys_ratio_and_fix(profile):
    profile(EMULATED)
    fields = {"actor_rollout_ref.rollout.dtype": "bfloat16", "actor_rollout_ref.actor.x.param_dtype": "auto"}
    message = P.slow_bf16_warning(fields, "cpu")
    assert "actor_rollout_ref.rollout.dtype" in message and "param_dtype" not in message
    assert "200x slower" in message and "actor_rollout_ref.rollout.dtype=auto" in message
    assert P.slow_bf16_warning(fields, "cuda") is None
    profile(FAST)
    assert P.slow_bf16_warning(fields, "cpu") is None


def test_describe_choices_is_one_line_with_the_reason(profile):
    profile(EMULATED)
    line = P.describe_choices({"a.param_dtype": "auto", "b.dtype": "bfloat16"}, "cpu")
    assert "\n" not in line
    assert "a.param_dtype=float32 (auto)" in line and "b.dtype=bfloat16" in line
    assert "no native bf16" in line and "AVX2" in line


def test_probe_is_cached_per_machine_and_isa_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRID_RL_CACHE", str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    calls = []
    monkeypatch.setattr(P, "measure_cpu_bf16", lambda: calls.append(1) or FAST)
    P.cpu_bf16_profile.cache_clear()
    try:
        assert P.cpu_bf16_profile() == FAST
        P.cpu_bf16_profile.cache_clear()
        assert P.cpu_bf16_profile() == FAST and len(calls) == 1  # read back from the file
        entries = json.loads((tmp_path / "precision.json").read_text())
        assert len(entries) == 1 and next(iter(entries.values()))["bf16_gflops"] == 2800.0
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # another ISA limit: another entry
        P.cpu_bf16_profile.cache_clear()
        P.cpu_bf16_profile()
        assert len(calls) == 2 and len(json.loads((tmp_path / "precision.json").read_text())) == 2
    finally:
        P.cpu_bf16_profile.cache_clear()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ATEN_CPU_CAPABILITY=avx2 is x86 only")
def test_real_probe_sees_a_simulated_avx2_cpu(tmp_path):
    """The measured path end to end: with torch and oneDNN limited to AVX2 (as on an AVX2-only CPU,
    or simulated on a faster one) bf16 is not native and auto picks fp32."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", HYBRID_RL_CACHE=str(tmp_path))
    env.pop(P.PROFILE_ENV, None)
    code = ("from hybrid_rl.utils.precision import cpu_bf16_profile, resolve_dtype\n"
            "p = cpu_bf16_profile(); print(p.native, resolve_dtype('auto', 'cpu'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "float32"], out.stderr[-2000:]


def test_workers_take_the_drivers_profile(monkeypatch):
    """Every rank resolves auto from the driver's probe (no re-probing that could disagree)."""
    monkeypatch.setattr(P, "cpu_bf16_profile", lambda: EMULATED)
    env = P.profile_env()  # what the driver puts into its workers' environment
    monkeypatch.undo()
    monkeypatch.setenv(P.PROFILE_ENV, env[P.PROFILE_ENV])
    monkeypatch.setattr(P, "measure_cpu_bf16", lambda: pytest.fail("a worker must not probe"))
    P.cpu_bf16_profile.cache_clear()
    P.auto_dtype.cache_clear()
    try:
        assert P.cpu_bf16_profile() == EMULATED and P.resolve_dtype("auto", "cpu") == "float32"
    finally:
        P.cpu_bf16_profile.cache_clear()
        P.auto_dtype.cache_clear()


def test_peak_is_none_when_a_matmul_would_be_too_slow():
    from hybrid_rl.trainer.core.model_facts import measure_peak_flops

    assert measure_peak_flops("cpu", 0.05, "float32", size=256, max_matmul_s=1e-9) is None
    peak = measure_peak_flops("cpu", 0.05, "float32", size=256)
    assert peak is not None and peak > 1e8
