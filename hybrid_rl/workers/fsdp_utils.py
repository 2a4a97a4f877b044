"""FSDP2 helpers: device/backend choice, ``fully_shard`` wrapping, full-weight streaming, offload.

By default every decoder layer (the classes HF lists in ``model._no_split_modules``) becomes one
FSDP2 unit and the root module (embeddings, final norm, LM/value head) another, so only one layer's
full parameters are materialised at a time. ``fsdp_config.layer_wrap`` may instead put the whole
model in one unit (:func:`wraps_layers`: one gather per pass, no per-layer hooks). The same code
runs on CPU with gloo (each process plays one "device") and on GPU with NCCL. Verified on torch
2.13 with 2 processes: gloo implements ``all_gather_into_tensor`` and ``reduce_scatter_tensor``
natively (fp32 and bf16), which is all FSDP2 needs; no fallback was required.

Mixed precision follows FSDP2's ``MixedPrecisionPolicy``: the sharded master weights keep the
dtype the model was loaded in (fp32), forward/backward run in ``param_dtype`` (``auto``: bf16 where
the device computes it natively) and gradients are reduced in ``reduce_dtype`` (fp32) before the
optimizer sees them.
"""

from __future__ import annotations

import logging
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers.config import FSDPConfig
from hybrid_rl.workers.model_loader import torch_dtype

logger = logging.getLogger(__name__)


def get_device() -> torch.device:
    """The device of this process: its CUDA device when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device`` without stalling the host: a host tensor bound for CUDA goes
    through pinned memory as an asynchronous copy (a pageable copy would wait for every kernel
    queued on the stream, once per micro-batch). Elsewhere a plain ``.to``."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def default_backend(device: torch.device) -> str:
    """``nccl`` for CUDA tensors, ``gloo`` for CPU tensors."""
    return "nccl" if device.type == "cuda" else "gloo"


def dp_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_device_mesh(device: torch.device, fsdp_size: int = -1) -> DeviceMesh:
    """1-D mesh over all ranks of the default group (the only layout supported so far)."""
    world = dist.get_world_size()
    if fsdp_size not in (-1, world):
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} is not supported: hybrid_rl shards "
                         f"each model over all {world} ranks (hybrid sharding is not implemented). "
                         "Fix: set fsdp_size to -1.")
    return init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))


def mixed_precision_policy(fsdp_config: FSDPConfig, device: torch.device) -> MixedPrecisionPolicy:
    """FSDP2 policy from ``fsdp_config.mixed_precision`` (compute and gradient-reduce dtypes;
    ``auto`` resolved for ``device``)."""
    mp = fsdp_config.mixed_precision
    return MixedPrecisionPolicy(param_dtype=torch_dtype(resolve_dtype(mp.param_dtype, device.type)),
                                reduce_dtype=torch_dtype(mp.reduce_dtype),
                                cast_forward_inputs=True)


def param_offloaded(fsdp_config: FSDPConfig, device: torch.device) -> bool:
    """Whether FSDP2 keeps the parameters on CPU between uses: ``param_offload`` on GPU only."""
    return fsdp_config.param_offload and device.type == "cuda"


def offload_policy(fsdp_config: FSDPConfig, device: torch.device) -> OffloadPolicy:
    """``CPUOffloadPolicy`` when ``param_offload`` is set on GPU; offload is moot on CPU."""
    if param_offloaded(fsdp_config, device):
        return CPUOffloadPolicy(pin_memory=True)
    if fsdp_config.param_offload:
        logger.info("fsdp_config.param_offload ignored: parameters already live in CPU memory")
    return OffloadPolicy()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Modules whose class is listed in HF's ``_no_split_modules`` (the transformer blocks)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no decoder-layer class in "
                         "_no_split_modules, so it cannot be sharded per layer. Fix: use an HF "
                         "transformers model (Llama, Qwen2, Mistral, ...).")
    return layers


#: ``layer_wrap=auto`` wraps the root only when the bound on what one group over the whole model
#: needs (:func:`root_wrap_bytes`) is at most this share of the GPU's memory.
ROOT_WRAP_MAX_MEMORY_FRAC = 0.05


def root_wrap_bytes(model: nn.Module, fsdp_config: FSDPConfig, device: torch.device) -> int:
    """An upper bound on the bytes one FSDP2 group over the whole model needs beyond the sharded
    weights, gradients and optimizer state that every grouping keeps: the gathered compute-dtype
    copy of every parameter, and for the trainable ones their unsharded gradients (compute dtype)
    and the gradient reduction's input and output buffers (``reduce_dtype``):
    ``numel * p + trainable_numel * (p + 2 * r)`` for itemsizes ``p`` and ``r``. FSDP2 frees the
    copy and the gradients as it fills the reduce buffers (allocated peak ``max(2p, p + r, 2r)``
    per parameter), but the caching allocator keeps the freed blocks reserved, so the sum is what
    the GPU loses. Per layer these exist for one layer (and the root's embeddings and head) at a
    time. bf16 compute, fp32 reduce, all trainable: 12 bytes per parameter, 1.6 GB for SmolLM2-135M."""
    policy = mixed_precision_policy(fsdp_config, device)
    p = policy.param_dtype.itemsize
    r = (policy.reduce_dtype or policy.param_dtype).itemsize
    numel = sum(t.numel() for t in model.parameters())
    trainable = sum(t.numel() for t in model.parameters() if t.requires_grad)
    return numel * p + trainable * (p + 2 * r)


def wraps_layers(model: nn.Module, fsdp_config: FSDPConfig, device: torch.device, world_size: int) -> bool:
    """Whether :func:`apply_fsdp2` gives each decoder layer its own group (``fsdp_config.layer_wrap``;
    ``auto`` picks the root alone on one CUDA rank without param offload when
    :func:`root_wrap_bytes` is at most :data:`ROOT_WRAP_MAX_MEMORY_FRAC` of the GPU's memory)."""
    if fsdp_config.layer_wrap != "auto":
        return fsdp_config.layer_wrap == "per_layer"
    if world_size != 1 or device.type != "cuda" or param_offloaded(fsdp_config, device):
        return True
    total = torch.cuda.get_device_properties(device).total_memory
    return root_wrap_bytes(model, fsdp_config, device) > ROOT_WRAP_MAX_MEMORY_FRAC * total


def apply_fsdp2(model: nn.Module, fsdp_config: FSDPConfig, device: torch.device,
                mesh: Optional[DeviceMesh] = None) -> nn.Module:
    """Shard ``model`` in place with ``fully_shard`` per decoder layer + root, or on the root alone
    (:func:`wraps_layers`); returns it. The two groupings compute the same numbers.

    Requires an initialised default process group. The model must already be on ``device`` (or on
    CPU when ``param_offload`` is used on GPU).
    """
    mesh = mesh or build_device_mesh(device, fsdp_config.fsdp_size)
    kwargs = dict(mesh=mesh, mp_policy=mixed_precision_policy(fsdp_config, device),
                  offload_policy=offload_policy(fsdp_config, device))
    per_layer = wraps_layers(model, fsdp_config, device, mesh.size())
    logger.info("FSDP2 groups: %s", "one per decoder layer + root" if per_layer else "the root alone")
    if not per_layer and fsdp_config.reshard_after_forward:
        logger.debug("fsdp_config.reshard_after_forward has no effect with one group over the whole "
                     "model: its parameters stay gathered from a forward until the backward ends")
    for layer in decoder_layers(model) if per_layer else []:
        fully_shard(layer, reshard_after_forward=fsdp_config.reshard_after_forward, **kwargs)
    # reshard_after_forward left at None: FSDP2 keeps the root's parameters gathered after forward
    # because backward needs them first (LM head).
    fully_shard(model, **kwargs)
    return model


def release_gathered(module: nn.Module) -> None:
    """Free the parameter copies FSDP2 still holds gathered after a no-grad pass of ``module`` (the
    root group keeps its copy after a forward for the backward that a no-grad pass never runs: the
    whole model under ``layer_wrap=root``; every layer's too with ``reshard_after_forward=false``).
    Every group of the module, since ``FSDPModule.reshard`` is not recursive; local, no collective;
    a no-op for groups already sharded and for modules FSDP2 does not manage."""
    for group in module.modules():
        if isinstance(group, FSDPModule):
            group.reshard()


def gather_full_tensor(tensor: DTensor) -> torch.Tensor:
    """All-gather a DTensor (collective). Shards offloaded to CPU are first moved to the mesh's
    device, because NCCL only gathers GPU tensors."""
    mesh_device = tensor.device_mesh.device_type
    if tensor.device.type != mesh_device:
        tensor = tensor.to(mesh_device)
    return tensor.full_tensor()


def iter_full_state(model: nn.Module, dtype: Optional[torch.dtype] = None,
                    device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every entry of ``model.state_dict()``, one at a time.

    Collective: every rank must iterate to the end together (each DTensor is all-gathered). Only
    one full parameter exists at a time, so peak memory is the largest single tensor. Tied weights
    appear under each of their names, as in the HF state dict.
    """
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = gather_full_tensor(tensor)
        tensor = tensor.detach()
        if dtype is not None:
            tensor = tensor.to(dtype)
        yield name, tensor.to(device)


def full_state_dict(model: nn.Module, dtype: Optional[torch.dtype] = None) -> dict[str, torch.Tensor]:
    """Materialised :func:`iter_full_state` on CPU (collective; for checkpoints and tests)."""
    return dict(iter_full_state(model, dtype=dtype))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor of the optimizer state to ``device`` (GPU optimizer offload)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: Optional[float]) -> torch.Tensor:
    """Global gradient L2 norm across shards and ranks, clipped in place when ``max_norm`` is set.

    Returns a plain 0-dim tensor (the DTensor norm gathered), possibly non-finite: the caller
    decides whether to skip the step.
    """
    grads = [p for p in parameters if p.grad is not None]
    if max_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in grads], 2.0)
    else:
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm.detach().float().cpu()
