"""Per-worker checkpoints: model, optimizer, LR scheduler and RNG states, sharded or full.

Layout of one worker folder (e.g. ``global_step_10/actor``)::

    checkpoint_meta.json                         world size, format, contents, step (written last)
    model_world_{W}_rank_{r}.safetensors         sharded: this rank's local shards
    model.safetensors                            full: unsharded HF-named tensors (rank 0)
    optim_world_{W}_rank_{r}.safetensors | optim.safetensors   (+ param groups in its metadata)
    extra_world_{W}_rank_{r}.safetensors         RNG states (+ LR scheduler state as JSON metadata)
    huggingface/                                 HF config + tokenizer (+ weights with hf_model)

Only safetensors and JSON are written — nothing is pickled, so loading never executes code.
Atomicity: every rank writes into ``<path>.tmp``; after a barrier rank 0 writes the metadata file,
fsyncs and renames the folder to ``<path>``. A crash leaves at most a ``.tmp`` folder; a folder
without ``checkpoint_meta.json`` is never treated as a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from hybrid_rl.workers.fsdp_utils import dp_world, gather_full_tensor, iter_full_state
from hybrid_rl.workers.lora import LORA_ADAPTER, is_lora_model, merged_lora_weights

META_FILE = "checkpoint_meta.json"
FORMAT_VERSION = 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: Optional[dict] = None) -> None:
    """safetensors file + fsync. Tensors sharing memory (tied weights) are stored once each."""
    unique = {k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}
    save_file(unique, str(path), metadata={k: json.dumps(v) for k, v in (metadata or {}).items()})
    _fsync_file(path)


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
    return tensors, meta


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's local piece of ``full`` laid out like the (possibly sharded) tensor ``like``."""
    if isinstance(like, DTensor):  # no communication: every rank holds ``full``
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()
    return full


def _file(kind: str, full: bool, world: int, rank: int) -> str:
    return f"{kind}.safetensors" if full else f"{kind}_world_{world}_rank_{rank}.safetensors"


# ------------------------------------------------------------------------- model
def _save_model(model: nn.Module, folder: Path, full: bool, rank: int, world: int) -> Optional[dict]:
    if not full:
        _save({k: _local(v) for k, v in model.state_dict().items()}, folder / _file("model", False, world, rank))
        return None
    state = dict(iter_full_state(model))  # collective: all ranks gather, rank 0 keeps
    if rank == 0:
        _save(state, folder / "model.safetensors")
    return state


def _load_model(model: nn.Module, folder: Path, full: bool, rank: int, world: int) -> None:
    tensors, _ = _load(folder / _file("model", full, world, rank))
    with torch.no_grad():
        for name, target in model.state_dict().items():
            if name not in tensors:
                raise ValueError(f"checkpoint {folder} has no tensor {name!r}: it was written for a "
                                 "different model. Fix: load it into the model it was saved from.")
            source = _shard_like(tensors[name], target) if full else tensors[name]
            _local(target).copy_(source)


# ------------------------------------------------------------------------- optimizer
def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _save_optimizer(model, optimizer, folder: Path, full: bool, rank: int, world: int) -> None:
    names = _param_names(model)
    tensors, groups = {}, []
    for group in optimizer.param_groups:
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [names[id(p)] for p in group["params"]]})
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, DTensor) and full:
                    value = gather_full_tensor(value)  # collective, same order on every rank
                tensors[f"{names[id(p)]}/{key}"] = _local(value)
    if not full or rank == 0:
        _save(tensors, folder / _file("optim", full, world, rank), {"param_groups": groups})


def _load_optimizer(model, optimizer, folder: Path, full: bool, rank: int, world: int) -> None:
    tensors, meta = _load(folder / _file("optim", full, world, rank))
    params = dict(model.named_parameters())
    if len(meta["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"checkpoint {folder}: optimizer has {len(optimizer.param_groups)} param "
                         f"groups, the checkpoint {len(meta['param_groups'])}")
    for group, saved in zip(optimizer.param_groups, meta["param_groups"]):
        group.update({k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"})
    for key, value in tensors.items():
        name, state_key = key.rsplit("/", 1)
        param = params[name]
        if isinstance(param, DTensor) and value.dim() > 0:
            local = _shard_like(value, param) if full else value
            value = DTensor.from_local(local.to(param.device), param.device_mesh, param.placements,
                                       shape=param.size(), stride=param.stride())
        optimizer.state[param][state_key] = value.to(param.device) if not isinstance(value, DTensor) else value


# ------------------------------------------------------------------------- extra (RNG, LR)
def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors = {"torch_cpu": torch.get_rng_state(), "python_mt": torch.tensor(mt, dtype=torch.int64),
               "numpy_keys": torch.from_numpy(np_keys.astype(np.int64))}
    if torch.cuda.is_available():
        tensors["torch_cuda"] = torch.cuda.get_rng_state()
    meta = {"python": [version, gauss], "numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)]}
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if "torch_cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["torch_cuda"])
    version, gauss = meta["python"]
    random.setstate((version, tuple(int(x) for x in tensors["python_mt"].tolist()), gauss))
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))


def _save_extra(lr_scheduler, folder: Path, rank: int, world: int) -> None:
    tensors, meta = _rng_state()
    meta["lr_scheduler"] = lr_scheduler.state_dict() if lr_scheduler is not None else None
    _save(tensors, folder / _file("extra", False, world, rank), {"extra": meta})


def _load_extra(lr_scheduler, folder: Path, rank: int, world: int) -> None:
    path = folder / _file("extra", False, world, rank)
    if not path.exists():
        raise ValueError(f"checkpoint {folder} has no RNG/LR state for rank {rank} of {world} "
                         "(extra_* files are per rank). Fix: resume with the worker count it was "
                         "saved with, or drop 'extra' from checkpoint.load_contents.")
    tensors, meta = _load(path)
    _set_rng_state(tensors, meta["extra"])
    if lr_scheduler is not None and meta["extra"]["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(meta["extra"]["lr_scheduler"])


# ------------------------------------------------------------------------- public API
def save_checkpoint(path: str, *, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    lr_scheduler: Any = None, hf_config: Any = None, tokenizer: Any = None,
                    contents: tuple[str, ...] = ("model", "optimizer", "extra"),
                    state_dict_type: str = "sharded", global_step: Optional[int] = None) -> None:
    """Write a checkpoint of this worker into ``path`` atomically (collective over all ranks).

    ``hf_config``/``tokenizer`` go to ``huggingface/`` so a merger can rebuild an HF folder; with
    ``"hf_model"`` in ``contents`` the full weights are written there too.
    """
    rank, world = dp_world()
    final, tmp = Path(path), Path(f"{path}.tmp")
    full = state_dict_type == "full"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    state = _save_model(model, tmp, full, rank, world) if "model" in contents else None
    if "hf_model" in contents:
        # collective; the HF weights are always unsharded, a LoRA actor's adapters merged into them
        stream = iter(state.items()) if state is not None else iter_full_state(model)
        state = dict(merged_lora_weights(stream, model)) if is_lora_model(model) else dict(stream)
    if "optimizer" in contents and optimizer is not None:
        _save_optimizer(model, optimizer, tmp, full, rank, world)
    if "extra" in contents:
        _save_extra(lr_scheduler, tmp, rank, world)
    _barrier()
    if rank == 0:
        _write_hf_folder(tmp / "huggingface", hf_config, tokenizer,
                         state if "hf_model" in contents else None)
        if is_lora_model(model):  # the merger rebuilds the adapters from it (rank, alpha, targets)
            model.peft_config[LORA_ADAPTER].save_pretrained(str(tmp / "huggingface"))
        meta = {"format_version": FORMAT_VERSION, "world_size": world, "global_step": global_step,
                "state_dict_type": state_dict_type, "contents": sorted(contents),
                "model_saved_as": "full" if full else "sharded"}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        _fsync_file(tmp / META_FILE)
        _publish(tmp, final)
    _barrier()


def _write_hf_folder(folder: Path, hf_config: Any, tokenizer: Any,
                     state: Optional[dict[str, torch.Tensor]]) -> None:
    folder.mkdir(exist_ok=True)
    if hf_config is not None:
        hf_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if state is not None:
        _save(state, folder / "model.safetensors", None)
    for file in folder.iterdir():
        _fsync_file(file)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished temp folder into place, replacing an older checkpoint at ``final``."""
    old = Path(f"{final}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)


def read_checkpoint_meta(path: str) -> dict[str, Any]:
    """The metadata of a complete checkpoint; ValueError if ``path`` is not one."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {META_FILE}); it may be missing or "
                         "a save was interrupted. Fix: point to a folder written by save_checkpoint.")
    return json.loads(meta_path.read_text())


def load_checkpoint(path: str, *, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    lr_scheduler: Any = None,
                    contents: tuple[str, ...] = ("model", "optimizer", "extra")) -> dict[str, Any]:
    """Restore what ``contents`` names from ``path`` (collective-free); returns the metadata.

    Full checkpoints load with any worker count; sharded ones (and RNG streams) need the count
    they were saved with.
    """
    meta = read_checkpoint_meta(path)
    rank, world = dp_world()
    full = meta["model_saved_as"] == "full"
    if not full and world != meta["world_size"] and ("model" in contents or "optimizer" in contents):
        raise ValueError(
            f"checkpoint {path} holds model/optimizer shards of {meta['world_size']} workers but this "
            f"run has {world}; sharded checkpoints reload only with the same worker count. Fix: resume "
            f"with {meta['world_size']} workers, or save with checkpoint.state_dict_type=full to "
            "change the worker count.")
    folder = Path(path)
    if "model" in contents and "model" in meta["contents"]:
        _load_model(model, folder, full, rank, world)
    if "optimizer" in contents and optimizer is not None and "optimizer" in meta["contents"]:
        _load_optimizer(model, optimizer, folder, full, rank, world)
    if "extra" in contents and "extra" in meta["contents"]:
        _load_extra(lr_scheduler, folder, rank, world)
    return meta
