"""Facts about the model a run trains, measured on the driver without building it: parameter counts
for FLOPs, the compute dtypes and why (one log line), and the device's achievable matmul peak (MFU)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Optional

from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core.run_config import RunConfig
from hybrid_rl.workers.config import ModelConfig

logger = logging.getLogger(__name__)


def _hf_config(model: ModelConfig):
    from hybrid_rl.workers.model_loader import load_hf_config, resolve_model_path

    return load_hf_config(resolve_model_path(model.path), trust_remote_code=model.trust_remote_code)


def count_model_params(model: ModelConfig) -> int:
    """Parameters of the causal LM ``model`` (a worker's model config, e.g. ``actor_rollout_ref.model``),
    counted on the meta device (nothing is allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(_hf_config(model), trust_remote_code=model.trust_remote_code)
    return sum(p.numel() for p in module.parameters())


def model_param_split(model: ModelConfig) -> tuple[int, int]:
    """``(body, head)`` parameters of ``model`` for FLOP counts: ``head`` = vocab x hidden (the LM
    head, which runs only on the positions that predict a response token), ``body`` = the rest
    (every computed token runs through it)."""
    hf_config = _hf_config(model)
    head = hf_config.vocab_size * hf_config.hidden_size
    return count_model_params(model) - head, head


@contextmanager
def worker_threads(plan: RunPlan) -> Iterator[None]:
    """The driver measures (probe, matmul peak) with the thread count one CPU worker computes with."""
    import torch

    threads = torch.get_num_threads()
    if plan.device == "cpu":
        torch.set_num_threads(plan.threads_per_worker)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def report_precision(cfg: RunConfig, plan: RunPlan, fields: dict[str, str]) -> str:
    """Log the run's compute dtypes and why in one line (and warn about an explicit bf16 on a CPU
    that emulates it); returns the resolved compute dtype of the first of ``fields`` (key -> configured
    dtype of each model the run builds, the trained one first). Resolving runs the CPU probe once here, on the
    driver, so the workers read its cached result."""
    from hybrid_rl.utils.precision import describe_choices, resolve_dtype, slow_bf16_warning

    def role_of(key: str) -> str:
        return "rollout" if key.endswith("rollout.dtype") else "train"

    with worker_threads(plan):  # probe with the threads one worker computes with
        logger.info(describe_choices(fields, plan.device, role_of))
    warning = slow_bf16_warning(fields, plan.device)
    if warning:
        logger.warning(warning)
    return resolve_dtype(next(iter(fields.values())), plan.device)


def measure_peak_flops(device: str, seconds: float = 0.5, dtype: str = "bfloat16", size: int = 2048,
                       max_matmul_s: float = 1.0) -> Optional[float]:
    """Achievable matmul FLOP/s of one worker's device, measured with ``size``-square ``dtype`` matmuls;
    None when one such matmul would take longer than ``max_matmul_s`` (an emulated dtype, e.g. bf16
    on an AVX2 CPU): no peak rather than a wrong one, and never minutes of measuring.

    MFU is reported against this measured peak rather than a datasheet number, so it reads the
    same on a laptop CPU and on a GPU. On CPU the measurement uses this process's threads. The
    matrices must be large: on a 2-core AVX-512 CPU a 512-square bf16 matmul reaches only ~10% of
    what a 2048-square one does, which made MFU look 5-10x better than it was.
    """
    import time

    import torch

    from hybrid_rl.workers.model_loader import torch_dtype

    dev = torch.device("cuda" if device == "cuda" else "cpu")

    def timed(a: torch.Tensor, b: torch.Tensor) -> float:
        start = time.perf_counter()
        torch.matmul(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    scout = torch.randn(size // 4, size // 4, device=dev, dtype=torch_dtype(dtype))
    timed(scout, scout)  # warm-up
    if timed(scout, scout) * 64 > max_matmul_s:  # 64 = (size / (size // 4)) ** 3
        return None
    a = torch.randn(size, size, device=dev, dtype=torch_dtype(dtype))
    b = torch.randn(size, size, device=dev, dtype=torch_dtype(dtype))
    torch.matmul(a, b)  # warm-up
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:  # best single matmul: the peak, robust to other processes taking the cores
        best = max(best, 2.0 * size**3 / timed(a, b))
        if time.perf_counter() > deadline:
            return best
