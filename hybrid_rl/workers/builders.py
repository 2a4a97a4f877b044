"""Build the trainable pieces of a worker: sharded models, AdamW, warm-up + constant/cosine LR.

Models are loaded on CPU in ``model.dtype`` (the master weights), optionally given gradient
checkpointing, moved to the device and sharded with FSDP2 when a process group is up (a single
process without one keeps the plain module — handy in notebooks and unit tests).
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from hybrid_rl.utils.mapped_weights import FileMappedWeights, ram_file_system
from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers.config import FSDPConfig, ModelConfig, OptimConfig
from hybrid_rl.workers.fsdp_utils import apply_fsdp2, decoder_layers, dp_world, param_offloaded
from hybrid_rl.workers.lean_layers import apply_lean_layers
from hybrid_rl.workers.lora import apply_lora, lora_enabled
from hybrid_rl.workers.model_loader import load_causal_lm, load_value_model, torch_dtype

logger = logging.getLogger(__name__)

# The value head is freshly initialised: the same seed on every rank gives every rank the same head.
_VALUE_HEAD_SEED = 0


def _place(model: nn.Module, fsdp_config: FSDPConfig, device: torch.device, *, frozen: bool = False
           ) -> nn.Module:
    offloaded = param_offloaded(fsdp_config, device)
    if not offloaded:  # with CPUOffloadPolicy FSDP2 expects the module on CPU
        model.to(device)
    if _sharded() and not (frozen and _frozen_unwrapped(fsdp_config, device)):
        apply_fsdp2(model, fsdp_config, device)
    return model


def _sharded() -> bool:
    return dist.is_available() and dist.is_initialized()


def _frozen_unwrapped(fsdp_config: FSDPConfig, device: torch.device) -> bool:
    """A frozen model in a one-process group is not wrapped by FSDP2: there is nothing to shard,
    no gradient to reduce, and FSDP2 would copy the whole model at every forward (its all-gather;
    7% of a SmolLM2 log-prob pass on CPU). It is stored in its compute dtype instead."""
    return dp_world()[1] == 1 and not param_offloaded(fsdp_config, device)


def _frozen_dtype(model_config: ModelConfig, fsdp_config: FSDPConfig, device: torch.device) -> str:
    """Storage dtype of a frozen model. Under FSDP2 it computes in ``mixed_precision.param_dtype``
    and has no optimizer, so fp32 master weights buy nothing: it is loaded in that dtype when it is
    narrower (as veRL loads its reference in bf16), or whenever FSDP2 does not wrap it. The forward
    sees the same weights (the cast happens at load instead of at every all-gather) and a narrower
    copy takes less memory."""
    if not _sharded():
        return model_config.dtype
    compute = resolve_dtype(fsdp_config.mixed_precision.param_dtype, device.type)
    narrower = torch_dtype(compute).itemsize < torch_dtype(model_config.dtype).itemsize
    return compute if narrower or _frozen_unwrapped(fsdp_config, device) else model_config.dtype


def _lora_base_dtype(model_config: ModelConfig, fsdp_config: FSDPConfig, device: torch.device) -> str:
    """Storage dtype of a LoRA actor's frozen base: the compute dtype when it is narrower than
    ``model.dtype``. The forward sees the same values (cast once here instead of at every FSDP2
    all-gather), the base takes half the memory in bf16, and peft keeps the adapters in fp32 (FSDP2
    needs a uniform dtype only among the trainable parameters)."""
    if not _sharded():  # no FSDP2 mixed precision: the model computes in its storage dtype
        return model_config.dtype
    compute = resolve_dtype(fsdp_config.mixed_precision.param_dtype, device.type)
    narrower = torch_dtype(compute).itemsize < torch_dtype(model_config.dtype).itemsize
    return compute if narrower else model_config.dtype


def compile_decoder_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` the parts of each decoder layer around attention, in place
    (``model.use_torch_compile``): its MLP and norms, where the elementwise ops fuse.

    Attention is left out: the packed layout it reads is a Python object whose block count changes
    from micro-batch to micro-batch, which would recompile the graph every time (its kernels are
    fused already). The module objects stay (checkpoints, LoRA and FSDP2's per-layer hooks see the
    same modules); only each child's ``forward`` is replaced by its compiled version, compiled on
    first use with dynamic shapes so packed micro-batches of other lengths reuse it.
    """
    for layer in decoder_layers(model):
        for name, child in layer.named_children():
            if "attn" not in name and "attention" not in name:
                child.forward = torch.compile(child.forward, dynamic=True, backend=backend)
    return model


def _speed_and_memory(model: nn.Module, model_config: ModelConfig, *, trainable: bool) -> None:
    """``use_torch_compile`` (compiled MLPs and norms), else ``use_lean_layers`` for a trained model
    (a frozen one runs without autograd, where the lean forwards change nothing)."""
    if model_config.use_torch_compile:
        compile_decoder_layers(model)
    elif trainable and model_config.use_lean_layers:
        counts = apply_lean_layers(model)
        logger.info("use_lean_layers: %d RMSNorms and %d MLPs run lean; %d look-alikes keep their own forward "
                    "(hybrid_rl/workers/lean_layers.py)", counts["rms_norm"], counts["mlp"], counts["skipped"])


def build_causal_lm(model_config: ModelConfig, path: str, fsdp_config: FSDPConfig,
                    device: torch.device, *, trainable: bool) -> nn.Module:
    """Policy or reference model from the local folder ``path`` (already resolved).

    ``trainable=False`` freezes it (reference policy) and skips gradient checkpointing; under FSDP2
    it is stored in its compute dtype (:func:`_frozen_dtype`), and in a one-process group it is not
    wrapped (:func:`_frozen_unwrapped`). ``trainable=True`` with ``model_config.lora_rank > 0`` wraps it
    with peft LoRA adapters: only they train (:mod:`hybrid_rl.workers.lora`).
    """
    if not trainable:
        dtype = _frozen_dtype(model_config, fsdp_config, device)
    elif lora_enabled(model_config):
        dtype = _lora_base_dtype(model_config, fsdp_config, device)
    else:
        dtype = model_config.dtype
    model = load_causal_lm(path, dtype=dtype,
                           trust_remote_code=model_config.trust_remote_code,
                           override_config=model_config.override_config)
    if trainable and model_config.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.requires_grad_(trainable)
    if trainable and lora_enabled(model_config):
        model = apply_lora(model, model_config)  # freezes the base, adapters trainable
    _speed_and_memory(model, model_config, trainable=trainable)
    return _place(model, fsdp_config, device, frozen=not trainable)


def offload_frozen_to_disk(module: nn.Module, setting: Optional[bool], device: torch.device
                           ) -> Optional[FileMappedWeights]:
    """``ref.disk_offload``: the frozen ``module``'s weights moved into a file mapping
    (:class:`~hybrid_rl.utils.mapped_weights.FileMappedWeights`), or None where it does not apply
    (see the field's docstring); ``setting=True`` where it cannot apply says why in one line."""
    if setting is False:
        return None
    if device.type != "cpu":
        if setting:
            raise ValueError("actor_rollout_ref.ref.disk_offload=true is for CPU workers. Fix: on GPU set "
                             "actor_rollout_ref.ref.fsdp_config.param_offload=true (weights in CPU memory between uses).")
        return None
    directory = tempfile.gettempdir()
    reason, memory_fs = None, ram_file_system(directory)
    if any(isinstance(p, DTensor) for p in module.parameters()):
        reason = "FSDP2 shards it across the workers"
    elif memory_fs:
        reason = f"TMPDIR ({directory}) is on {memory_fs}, which is memory"
    if reason is None:
        try:
            return FileMappedWeights(module, directory)
        except OSError as error:  # e.g. a full disk; the module is untouched until the file is mapped
            reason = f"writing its weights to TMPDIR ({directory}) failed: {error}"
    log = logger.warning if setting else logger.info
    log("actor_rollout_ref.ref.disk_offload=%s: the reference stays in memory: %s (set TMPDIR to a "
        "disk-backed directory with room for it).", "true" if setting else "null", reason)
    return None


def build_value_model(model_config: ModelConfig, path: str, fsdp_config: FSDPConfig,
                      device: torch.device) -> nn.Module:
    """Critic: the backbone at ``path`` with a one-output token-classification head."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_VALUE_HEAD_SEED)
        model = load_value_model(path, dtype=model_config.dtype,
                                 trust_remote_code=model_config.trust_remote_code,
                                 override_config=model_config.override_config)
    if model_config.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _speed_and_memory(model, model_config, trainable=True)
    return _place(model, fsdp_config, device)


def build_optimizer(module: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (sharded DTensors under FSDP2).

    Uses torch's fused kernel where it exists (floating-point parameters on CPU or CUDA): one
    AdamW step of SmolLM2-135M on 2 CPU cores takes 0.1 s fused vs 0.38-0.46 s with the default
    per-tensor loop. It is deterministic, so seeded runs still reproduce.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             weight_decay=optim.weight_decay, fused=fused or None)


@dataclass
class WarmupSchedule:
    """LR multiplier: linear warm-up from 0, then constant or cosine decay to ``min_lr_ratio``.

    A dataclass rather than a lambda so ``LambdaLR.state_dict()`` stores its fields (plain
    numbers) and a checkpoint restores the same schedule.
    """

    warmup_steps: int
    total_steps: int
    cosine: bool
    min_lr_ratio: float
    num_cycles: float

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if not self.cosine:
            return 1.0
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        progress = min(progress, 1.0)
        cos = 0.5 * (1.0 + math.cos(math.pi * 2.0 * self.num_cycles * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, *, key: str,
                       total_training_steps: Optional[int]) -> LambdaLR:
    """Scheduler stepped once per training step.

    ``total_training_steps`` is what the trainer computed; ``optim.total_training_steps`` wins when
    the user set it (> 0). ``key`` (e.g. ``actor_rollout_ref.actor.optim``) names the config
    section in errors.
    """
    total = optim.total_training_steps if optim.total_training_steps > 0 else total_training_steps
    needs_total = optim.scheduler_type == "cosine" or (
        optim.lr_warmup_steps < 0 and optim.lr_warmup_steps_ratio > 0)
    if needs_total and not total:
        raise ValueError(f"{key}.total_training_steps is unknown but the schedule needs it "
                         f"(lr_scheduler_type={optim.scheduler_type}, lr_warmup_steps_ratio="
                         f"{optim.lr_warmup_steps_ratio}). Fix: set {key}.total_training_steps, "
                         "or let the trainer pass it.")
    total = total or 0
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(
        optim.lr_warmup_steps_ratio * total)
    schedule = WarmupSchedule(warmup_steps=warmup, total_steps=total,
                              cosine=optim.scheduler_type == "cosine",
                              min_lr_ratio=optim.min_lr_ratio, num_cycles=optim.num_cycles)
    return LambdaLR(optimizer, schedule)
