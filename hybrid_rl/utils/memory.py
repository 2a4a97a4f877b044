"""Where a process's memory goes, measured: peak RSS per phase and bytes held per owner.

Peak RSS of a phase comes from the kernel's high-water mark (``VmHWM`` in ``/proc/self/status``),
reset at the start of the phase by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0): the
exact peak, with no sampling thread and no cost. Where that reset is not allowed (another OS, a
locked-down container) the peak is the process's lifetime maximum (``ru_maxrss``):
:func:`reset_peak_rss` returns False there.

At the end of every phase, :func:`release_free_memory` hands the pages the allocator holds free back
to the kernel when the allocator is the jemalloc of ``trainer.cpu_allocator`` (configured never to
return memory on its own: see :mod:`hybrid_rl.utils.cpu_env`), so one phase's freed working set
does not fragment under the next one's.

Bytes per owner are the distinct tensor storages an owner holds (actor parameters, gradients,
optimizer state, the reference, the rollout engine's weights and KV cache): counted from the live
tensors, each storage once, so a tensor shared by two owners (a LoRA actor's base serving as the
reference) is not counted twice when the same ``seen`` set is passed to both.
"""

from __future__ import annotations

import ctypes
import functools
import resource
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

import torch

GIB = 2**30

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def reset_peak_rss() -> bool:
    """Restart the high-water mark at the current RSS; False where the OS does not allow it."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """High-water mark of this process's RSS since the last :func:`reset_peak_rss` (or its start), in bytes."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    kib_or_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib_or_bytes if sys.platform == "darwin" else kib_or_bytes * 1024


_ALL_ARENAS_PURGE = b"arena.4096.purge"  # MALLCTL_ARENAS_ALL (jemalloc >= 4.5): every arena


@functools.lru_cache(maxsize=1)
def _jemalloc_mallctl():
    """jemalloc's ``mallctl`` when jemalloc is this process's allocator (``LD_PRELOAD``), else None."""
    try:
        return ctypes.CDLL(None).mallctl  # glibc has no such symbol
    except (AttributeError, OSError):
        return None


def release_free_memory() -> bool:
    """Return the pages jemalloc holds free to the kernel (``arena.<all>.purge``); True if it did.
    A no-op (False) under glibc, whose ``cpu_allocator=glibc`` setting keeps freed memory on purpose."""
    mallctl = _jemalloc_mallctl()
    return mallctl is not None and mallctl(_ALL_ARENAS_PURGE, None, None, None, ctypes.c_size_t(0)) == 0


@contextmanager
def phase_peak(metrics: dict, key: str) -> Iterator[None]:
    """Record the process's peak RSS inside the block as ``metrics[key]`` in GiB (the lifetime
    peak where the OS cannot reset the high-water mark), then :func:`release_free_memory`. With CUDA, also the peak GPU memory of
    this process inside the block: ``perf/max_memory_allocated_gib/<phase>`` (tensors) and
    ``perf/max_memory_reserved_gib/<phase>`` (held by the caching allocator), ``<phase>`` being
    the last part of ``key``."""
    reset_peak_rss()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        metrics[key] = peak_rss() / GIB
        release_free_memory()
        if cuda:
            phase = key.rsplit("/", 1)[-1]
            metrics[f"perf/max_memory_allocated_gib/{phase}"] = torch.cuda.max_memory_allocated() / GIB
            metrics[f"perf/max_memory_reserved_gib/{phase}"] = torch.cuda.max_memory_reserved() / GIB


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local part of a DTensor (an FSDP2 shard); the tensor itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def tensor_bytes(tensors: Iterable[Optional[torch.Tensor]], seen: Optional[set] = None,
                 device: Optional[str] = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries skipped), each storage
    counted once across calls sharing ``seen``; only storages on ``device`` when it is given."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = _local(tensor)
        if device is not None and local.device.type != device:
            continue
        storage = local.untyped_storage()
        key = (local.device.type, storage.data_ptr())
        if storage.data_ptr() == 0 or key in seen:  # empty or already counted (shared / tied)
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def module_bytes(module: torch.nn.Module, seen: Optional[set] = None) -> int:
    """Parameters and buffers of ``module`` (its local shards under FSDP2)."""
    return tensor_bytes([*module.parameters(), *module.buffers()], seen)


def grad_bytes(module: torch.nn.Module, seen: Optional[set] = None) -> int:
    """Gradients currently held by ``module``'s parameters."""
    return tensor_bytes((p.grad for p in module.parameters()), seen)


def optimizer_bytes(optimizer: torch.optim.Optimizer, seen: Optional[set] = None) -> int:
    """Optimizer state tensors (AdamW: ``exp_avg``, ``exp_avg_sq``, ``step``)."""
    return tensor_bytes((v for state in optimizer.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor)), seen)
