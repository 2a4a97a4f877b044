"""Which kernel computes packed attention: the one place that chooses, by device and installed kernels.

``*.model.attn_implementation`` (veRL's name; ``auto`` by default) picks the kernel for the packed
forward (``use_remove_padding``). Two layouts are told apart, since not every kernel expresses both:

* **rows** (one causal segment per packed row): ``flash_attention_2`` (flash-attn's
  ``flash_attn_varlen_func``, as veRL and OpenRLHF use it), ``varlen_attn`` (torch's own
  ``torch.nn.attention.varlen.varlen_attn``, flash kernels shipped with torch), ``flex_attention``
  or ``sdpa`` (:mod:`hybrid_rl.workers.varlen_attention`'s CPU path: batched small blocks, else
  one SDPA call per block);
* **prompt groups** (the prefix grouper: a response attends to its group's prompt and causally to
  itself): ``flex_attention`` or ``sdpa`` only (a varlen kernel's keys must be contiguous).

``auto``: on CUDA, rows by flash-attn when it is installed, else torch's varlen kernel when this
torch has one, else FlexAttention; prompt groups by FlexAttention. On CPU, ``sdpa`` for both:
FlexAttention has no CPU backward and its eager forward is slower there. The choice is made once
per worker process (the actor, reference and critic there share one device) and logged once.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from dataclasses import dataclass

import torch

from hybrid_rl.workers.config import ATTN_IMPLEMENTATIONS

__all__ = ["ATTN_IMPLEMENTATIONS", "AttentionChoice", "current_choice", "resolve_attention", "set_attention",
           "torch_varlen_attention", "flash_varlen_attention"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionChoice:
    """The kernels of the packed forward."""

    rows: str
    """Kernel for row-packed layouts: sdpa | flex_attention | flash_attention_2 | varlen_attn."""
    groups: str
    """Kernel for prefix-grouped layouts: sdpa | flex_attention."""


_CPU_DEFAULT = AttentionChoice("sdpa", "sdpa")
_current = _CPU_DEFAULT
_logged: set[AttentionChoice] = set()


def has_flash_attn() -> bool:
    """Whether flash-attn is installed (``flash_attn_varlen_func``)."""
    return importlib.util.find_spec("flash_attn") is not None


def has_torch_varlen() -> bool:
    """Whether this torch has ``torch.nn.attention.varlen`` (torch >= 2.9)."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def has_flex() -> bool:
    """Whether this torch has FlexAttention."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def resolve_attention(requested: str, device_type: str, key: str = "actor_rollout_ref.model.attn_implementation"
                      ) -> AttentionChoice:
    """The :class:`AttentionChoice` for ``requested`` on ``device_type``; a kernel that cannot run
    here is one ``ValueError`` naming ``key`` and the fix."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"{key}={requested!r} is not a packed-attention kernel; use one of {list(ATTN_IMPLEMENTATIONS)}")
    cuda = device_type == "cuda"
    if requested == "auto":
        if not cuda:
            return _CPU_DEFAULT
        groups = "flex_attention" if has_flex() else "sdpa"
        rows = "flash_attention_2" if has_flash_attn() else "varlen_attn" if has_torch_varlen() else groups
        return AttentionChoice(rows, groups)
    if requested == "sdpa":
        return _CPU_DEFAULT
    problem = None
    if requested == "flex_attention" and not has_flex():
        problem = f"this torch ({torch.__version__}) has no FlexAttention (torch >= 2.5 does)"
    elif requested == "flex_attention" and not cuda:
        problem = "FlexAttention has no backward on CPU in torch, and its CPU forward is slower than sdpa"
    elif requested == "flash_attention_2" and not (cuda and has_flash_attn()):
        problem = ("flash-attn runs on CUDA only" if not cuda else
                   "flash_attn is not installed (pip install flash-attn: a prebuilt wheel matching this torch "
                   "and CUDA, docs/gpu.md)")
    elif requested == "varlen_attn" and not (cuda and has_torch_varlen()):
        problem = ("torch's varlen_attn runs on CUDA only" if not cuda else
                   f"this torch ({torch.__version__}) has no torch.nn.attention.varlen")
    if problem:
        raise ValueError(f"{key}={requested}: {problem}. Fix: set {key}=auto (or sdpa).")
    return AttentionChoice(requested, "flex_attention" if has_flex() else "sdpa")


def set_attention(choice: AttentionChoice) -> None:
    """Make ``choice`` this process's packed-attention kernels (logged once per distinct choice)."""
    global _current
    _current = choice
    if choice not in _logged:
        _logged.add(choice)
        logger.info("packed attention: rows by %s, prompt groups by %s", choice.rows, choice.groups)


def current_choice() -> AttentionChoice:
    """This process's packed-attention kernels (``sdpa`` until a model chose otherwise)."""
    return _current


def flash_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           cu_seq_lens: torch.Tensor, max_length: int, scaling: float) -> torch.Tensor:
    """``query [1, H, T, D]``, ``key/value [1, H_kv, T, D]`` -> ``[1, T, H, D]``: flash-attn's
    varlen kernel, each packed row causal (``cu_seq_lens [rows + 1]`` int32 on the device)."""
    from flash_attn import flash_attn_varlen_func

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    out = flash_attn_varlen_func(q, k, v, cu_seq_lens, cu_seq_lens, max_length, max_length,
                                 dropout_p=0.0, softmax_scale=scaling, causal=True)
    return out.unsqueeze(0)


def torch_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           cu_seq_lens: torch.Tensor, max_length: int, scaling: float) -> torch.Tensor:
    """As :func:`flash_varlen_attention`, with torch's ``varlen_attn`` (its causal switch and GQA
    support differ across torch versions: read from its signature)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    if "scale" not in params:  # torch 2.9's varlen_attn scales by 1/sqrt(D) only: fold the rest into q
        query = query * (scaling * query.shape[-1] ** 0.5)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    kwargs = {"scale": scaling} if "scale" in params else {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal
    else:
        kwargs["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    cu = cu_seq_lens.to(torch.int32)
    return varlen_attn(q, k, v, cu, cu, max_length, max_length, **kwargs).unsqueeze(0)
