"""The one place that decides compute dtypes: ``dtype: auto`` resolved for the device that runs.

Every config field naming a compute dtype (``*.fsdp_config.mixed_precision.param_dtype``,
``rollout.dtype``) defaults to ``auto``; whoever needs a concrete dtype calls :func:`resolve_dtype`
with its device. Explicit values are honoured as written.

``auto`` means:

- **CUDA**: bf16 where the GPU computes it (``torch.cuda.is_bf16_supported()``). Otherwise the
  rollout runs fp16 (as vLLM casts bf16 models on such GPUs) and training runs fp32: fp16 training
  needs loss scaling, which the FSDP2 actor does not do.
- **CPU**: bf16 only when the CPU computes it natively *and* a short timed probe confirms it.
  Native = oneDNN's bf16 report (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, which also
  follows ``ATEN_CPU_CAPABILITY``) plus AVX512_BF16 or AMX on x86 (AVX-512 without them emulates
  bf16) or the ARM BF16 extension. The probe times a bf16 and an fp32 matmul of the model's shape
  (~0.1 s); bf16 is chosen when it is at least :data:`BF16_MIN_SPEEDUP` times as fast. Measured
  ratios: ~0.003-0.02 on AVX2-only CPUs (emulated), ~2.3 on AVX-512 Zen 4, 3-8 with AMX. The
  result is cached per machine, torch version and ISA environment in ``$HYBRID_RL_CACHE`` (or
  ``~/.cache/hybrid_rl``)/``precision.json``, so the driver and every worker agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping, Optional

from hybrid_rl.utils.cache import cache_root

logger = logging.getLogger(__name__)

AUTO = "auto"
_CANONICAL = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
              "float16": "float16", "fp16": "float16", AUTO: AUTO}
COMPUTE_DTYPES = tuple(_CANONICAL)
"""Names a compute-dtype field accepts (veRL's spellings and ``auto``)."""
CONCRETE_DTYPES = tuple(name for name in COMPUTE_DTYPES if name != AUTO)
"""Names of a fixed dtype (master weights, gradient reduction, a resolved compute dtype)."""

BF16_MIN_SPEEDUP = 1.5
"""On CPU, ``auto`` picks bf16 only when the probe's bf16 matmul is at least this much faster than
fp32: at equal speed fp32 is the better choice (exact, no casts)."""

SLOW_BF16_RATIO = 1.0
"""An explicit bf16 on a CPU where the probe measured bf16 slower than fp32 gets a warning."""

_PROBE_SHAPE = (1024, 576, 1536)  # tokens x hidden x MLP width of SmolLM2-135M: the model's matmul
_SCOUT_SHAPE = (128, 576, 576)  # small first try: emulated bf16 is too slow for the full shape
_CACHE_FILE = "precision.json"
_ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def canonical_dtype(name: str) -> str:
    """``bf16`` -> ``bfloat16``, ``fp32`` -> ``float32``, ... (``auto`` stays ``auto``). The config
    dataclasses reject other names with their key first; this is the last line of defence."""
    if name not in _CANONICAL:
        raise ValueError(f"dtype {name!r} is not one of {COMPUTE_DTYPES}; use auto, float32 or bfloat16")
    return _CANONICAL[name]


@dataclass(frozen=True)
class CpuBf16Profile:
    """What this CPU does with bf16 matmuls (measured once per machine and torch version)."""

    isa: str
    """torch's CPU capability (AVX2, AVX512, ...) and the bf16 features seen, e.g. ``AVX512+amx``."""
    native: bool
    """The CPU has bf16 instructions oneDNN uses (AVX512_BF16, AMX or ARM BF16)."""
    fp32_gflops: float
    """Probe fp32 matmul speed, GFLOP/s (this process's threads)."""
    bf16_gflops: float
    """Probe bf16 matmul speed, GFLOP/s."""

    @property
    def speedup(self) -> float:
        """bf16 speed / fp32 speed (below 1: bf16 is slower)."""
        return self.bf16_gflops / self.fp32_gflops if self.fp32_gflops > 0 else 0.0

    @property
    def bf16_is_fast(self) -> bool:
        """bf16 computed natively and measured at least :data:`BF16_MIN_SPEEDUP` x fp32."""
        return self.native and self.speedup >= BF16_MIN_SPEEDUP


def _cpu_flags() -> tuple[str, bool]:
    """(ISA description, native bf16) from torch's and oneDNN's own capability reports."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if platform.machine().lower() in ("aarch64", "arm64"):
        return f"{capability}{'+bf16' if onednn_bf16 else ''}", onednn_bf16
    features = [name for name, check in (("avx512_bf16", "_is_avx512_bf16_supported"),
                                         ("amx", "_is_amx_tile_supported"))
                if getattr(torch.cpu, check, lambda: False)()]
    native = onednn_bf16 and bool(features)
    return "+".join([capability, *features]) if native else capability, native


def _matmul_gflops(shape: tuple[int, int, int], dtype, budget_s: float) -> float:
    """Best single-matmul speed of ``[m, k] @ [k, n]`` in ``dtype`` within about ``budget_s``."""
    import torch

    m, k, n = shape
    gen = torch.Generator().manual_seed(0)  # the caller's RNG stays untouched
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    torch.matmul(a, b)  # warm-up: oneDNN builds its kernel on the first call
    best, deadline = float("inf"), time.perf_counter() + budget_s
    for _ in range(50):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return 2.0 * m * k * n / best / 1e9


def measure_cpu_bf16() -> CpuBf16Profile:
    """Probe this CPU (~0.1-0.5 s): its flags, then fp32 vs bf16 matmul speed on the model's shape.
    An emulated bf16 is seen on the small scout shape and not timed further."""
    import torch

    isa, native = _cpu_flags()
    fp32 = _matmul_gflops(_PROBE_SHAPE, torch.float32, 0.15)
    bf16 = _matmul_gflops(_SCOUT_SHAPE, torch.bfloat16, 0.05)
    if bf16 >= 0.5 * _matmul_gflops(_SCOUT_SHAPE, torch.float32, 0.05):  # not emulated: time it fully
        bf16 = _matmul_gflops(_PROBE_SHAPE, torch.bfloat16, 0.15)
    return CpuBf16Profile(isa=isa, native=native, fp32_gflops=round(fp32, 1), bf16_gflops=round(bf16, 1))


def _fingerprint() -> str:
    """Key of the probe cache: CPU model and feature flags (VMs report generic model names), torch
    version, ISA and the environment that limits it."""
    import torch

    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
        model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), model)
        flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    flags_hash = hashlib.sha256(flags.encode()).hexdigest()[:12]
    env = ",".join(f"{k}={os.environ[k]}" for k in _ISA_ENV if k in os.environ)
    return f"{model}|flags {flags_hash}|torch {torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|{env}"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, entries: dict) -> None:
    """Atomic write (another process may read the file at the same time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as error:  # a read-only home only costs a re-probe next time
        logger.debug("precision cache not written (%s)", error)


PROFILE_ENV = "HYBRID_RL_CPU_BF16_PROFILE"
"""The driver's probe result (JSON), passed to its workers so every rank resolves ``auto`` alike."""


def profile_env() -> dict[str, str]:
    """Worker environment carrying this process's :func:`cpu_bf16_profile` (see :data:`PROFILE_ENV`)."""
    return {PROFILE_ENV: json.dumps(asdict(cpu_bf16_profile()), sort_keys=True)}


@lru_cache(maxsize=1)
def cpu_bf16_profile() -> CpuBf16Profile:
    """This machine's :class:`CpuBf16Profile`: the driver's (:data:`PROFILE_ENV`), else the cached
    probe, else measured once and cached."""
    if os.environ.get(PROFILE_ENV):
        return CpuBf16Profile(**json.loads(os.environ[PROFILE_ENV]))
    path, key = cache_root() / _CACHE_FILE, _fingerprint()
    entries = _read_cache(path)
    if key in entries:
        try:
            return CpuBf16Profile(**entries[key])
        except TypeError:
            pass  # written by another version: measure again
    profile = measure_cpu_bf16()
    _write_cache(path, {**_read_cache(path), key: asdict(profile)})
    return profile


@dataclass(frozen=True)
class DtypeChoice:
    """What ``auto`` means on one device, and why (for the run's log line)."""

    dtype: str
    """Canonical dtype name: bfloat16 | float16 | float32."""
    reason: str
    """Short why, e.g. ``AVX2: bf16 matmul 0.01x fp32``."""


def _cpu_reason(profile: CpuBf16Profile) -> str:
    flags = "native bf16" if profile.native else "no native bf16"
    return (f"CPU {profile.isa}, {flags}, bf16 matmul {profile.speedup:.2g}x fp32 "
            f"({profile.bf16_gflops:.0f} vs {profile.fp32_gflops:.0f} GFLOP/s)")


@lru_cache(maxsize=None)
def auto_dtype(device: str, role: str = "train") -> DtypeChoice:
    """What ``auto`` resolves to for ``role`` (``train``: FSDP compute dtype; ``rollout``: the
    inference copy) on ``device`` (``cpu`` or ``cuda[:i]``)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # e.g. engine arguments built for a GPU in a CPU-only test
            return DtypeChoice("bfloat16", "no CUDA device visible to ask; bf16 assumed")
        if torch.cuda.is_bf16_supported(including_emulation=False):  # V100/T4 only emulate it
            return DtypeChoice("bfloat16", f"{torch.cuda.get_device_name()} supports bf16")
        fallback = "float16" if role == "rollout" else "float32"
        return DtypeChoice(fallback, f"{torch.cuda.get_device_name()} has no bf16")
    profile = cpu_bf16_profile()
    return DtypeChoice("bfloat16" if profile.bf16_is_fast else "float32", _cpu_reason(profile))


def resolve_dtype(name: str, device: str, role: str = "train") -> str:
    """The concrete dtype of a config value: ``auto`` per :func:`auto_dtype`, else ``name``."""
    name = canonical_dtype(name)
    return auto_dtype(device, role).dtype if name == AUTO else name


def describe_choices(fields: Mapping[str, str], device: str,
                     role_of: Callable[[str], str] = lambda key: "train") -> str:
    """One log line: what each compute-dtype field resolves to on ``device`` and why."""
    parts, reasons = [], []
    for key, value in fields.items():
        role = role_of(key)
        resolved = resolve_dtype(value, device, role)
        parts.append(f"{key}={resolved}" + (" (auto)" if canonical_dtype(value) == AUTO else ""))
        if canonical_dtype(value) == AUTO and auto_dtype(device, role).reason not in reasons:
            reasons.append(auto_dtype(device, role).reason)
    why = f" [{'; '.join(reasons)}]" if reasons else ""
    return f"precision on {device}: " + ", ".join(parts) + why


def slow_bf16_warning(fields: Mapping[str, str], device: str) -> Optional[str]:
    """A warning when fields explicitly ask for bf16 on a CPU where it is slower than fp32."""
    forced = [key for key, value in fields.items() if canonical_dtype(value) == "bfloat16"]
    if not forced or device.startswith("cuda"):
        return None
    profile = cpu_bf16_profile()
    if profile.speedup >= SLOW_BF16_RATIO:
        return None
    slower = profile.fp32_gflops / max(profile.bf16_gflops, 1e-9)
    return (f"{', '.join(forced)} = bfloat16, but on this CPU ({profile.isa}) a bf16 matmul runs {slower:.0f}x "
            f"slower than fp32 ({profile.bf16_gflops:.1f} vs {profile.fp32_gflops:.0f} GFLOP/s, measured). "
            f"Fix: set {' '.join(f'{k}=auto' for k in forced)} (or float32).")
