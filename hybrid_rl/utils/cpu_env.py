"""Process environment for CPU workers (torch-free: it must be set before the worker starts).

OpenMP waiting. ``GOMP_SPINCOUNT`` is how many iterations a GNU OpenMP thread (torch's runtime on
Linux) spins before it sleeps. Measured with vLLM generation on 2 cores (docs/rollout.md), tok/s:
the OpenMP default (300k spins) gave 677 quiet but 133 beside one busy process; never spinning
(``OMP_WAIT_POLICY=PASSIVE``) 470 quiet and 322 beside it; 1000 spins 600 quiet and 281 beside it.

Memory allocator (``trainer.cpu_allocator``). glibc's default serves large blocks (activations,
logits, gradients) with fresh ``mmap`` pages and returns them to the kernel on free, so every
training step faults its whole activation footprint back in: ~400k minor page faults per update at
``benchmarks/bench_step.py``'s shape, ~1 s of a 4-5 s update (docs/performance.md). Two choices:
- ``glibc`` tuned to keep freed memory for reuse, as the CUDA caching allocator does:
  no ``mmap``-served blocks and no trimming of the heap. Fastest; the heap fragments and the process
  keeps its peak footprint.
- ``jemalloc`` (the copy Ray ships in ``ray/core/libjemalloc.so``, loaded with ``LD_PRELOAD``): its
  size classes fragment less and it returns pages unused for 10 s, so the peak is 1.3-1.8 GiB lower
  (docs/memory.md). Memory returned between steps is faulted back in at the next one: +2.6% at
  bench_step.py's 6 s steps, +35% in the default run's 20 s steps' update. ``oversize_threshold:0``
  keeps blocks above 8 MiB in the normal arenas instead of a dedicated one purged at once.
- ``auto`` (the default): jemalloc where the memory this process may use (the smaller of the
  machine's RAM and its cgroup's limit) is below :data:`AUTO_JEMALLOC_BELOW_GIB`, glibc otherwise.
  On an 8 GiB laptop the default run then fits (glibc would hold ~8.2 GiB at its peak); a larger
  machine keeps the fastest allocator. The threshold is on the total (not the free) memory, read in
  the driver: a run joining a Ray cluster on other machines should set the allocator by hand.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

CPU_OPENMP_SPINCOUNT = "1000"
"""Spin iterations before a waiting OpenMP thread sleeps (see the module docstring)."""

CPU_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
"""glibc malloc settings that keep freed memory in the process (see the module docstring)."""

_ALLOCATOR_KEYS = ("LD_PRELOAD", "GLIBC_TUNABLES")

CPU_ALLOCATORS = ("auto", "glibc", "jemalloc")
"""Values of ``trainer.cpu_allocator``."""

AUTO_JEMALLOC_BELOW_GIB = 12.0
"""``cpu_allocator=auto`` picks jemalloc when the process may use less memory than this (GiB)."""

_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1

JEMALLOC_CONF = "oversize_threshold:0"
"""jemalloc options for CPU workers (see the module docstring)."""


def bundled_jemalloc() -> Optional[str]:
    """Path of the jemalloc library Ray ships (Linux wheels), or None; Ray is not imported."""
    if not sys.platform.startswith("linux"):
        return None
    spec = importlib.util.find_spec("ray")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "core", "libjemalloc.so")
        if os.path.isfile(path):
            return path
    return None


def _cgroup_limits(proc_cgroup: str, cgroup_root: str) -> list[int]:
    """Memory limits (bytes) of this process's cgroup and its ancestors, v1 and v2. The path in
    ``/proc/self/cgroup`` may carry a prefix the container's mount does not show, so the longest
    suffix that exists under ``cgroup_root`` is taken."""
    limits = []
    for line in proc_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:  # not a cgroup line: nothing to read
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one unified hierarchy
            base, name = cgroup_root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = os.path.join(cgroup_root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]  # ".." = outside the namespace's root
        for skip in range(len(parts) + 1):
            if os.path.isdir(os.path.join(base, *parts[skip:])):
                break
        kept = parts[skip:]
        for depth in range(len(kept), -1, -1):  # the cgroup, then each ancestor up to the mount
            value = _read(os.path.join(base, *kept[:depth], name))
            if value and value != "max" and value.isdigit() and int(value) < _UNLIMITED:
                limits.append(int(value))
    return limits


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def memory_limit_bytes(proc_cgroup_path: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup",
                       meminfo_path: str = "/proc/meminfo") -> Optional[int]:
    """The memory this process may use: the smaller of the machine's RAM (``MemTotal``) and any
    cgroup limit above it; None where neither can be read (not Linux)."""
    limits = _cgroup_limits(_read(proc_cgroup_path) or "", cgroup_root)
    for line in (_read(meminfo_path) or "").splitlines():
        fields = line.split()
        if fields[:1] == ["MemTotal:"] and len(fields) > 1 and fields[1].isdigit():
            limits.append(int(fields[1]) * 1024)
    return min(limits) if limits else None


def _check_allocator(allocator: str) -> None:
    if allocator not in CPU_ALLOCATORS:
        raise ValueError(f"trainer.cpu_allocator={allocator!r} is invalid: must be one of {CPU_ALLOCATORS}. "
                         "Fix: use auto (jemalloc on small machines), glibc (fastest) or jemalloc (less memory).")


def resolve_cpu_allocator(allocator: str, limit_bytes: Optional[int] = None) -> str:
    """``glibc`` or ``jemalloc`` for ``trainer.cpu_allocator``; ``auto`` by ``limit_bytes`` (default:
    :func:`memory_limit_bytes`), see the module docstring."""
    _check_allocator(allocator)
    if allocator != "auto":
        return allocator
    limit = memory_limit_bytes() if limit_bytes is None else limit_bytes
    if limit is not None and limit < AUTO_JEMALLOC_BELOW_GIB * 2**30:
        logger.info("trainer.cpu_allocator=auto: jemalloc, as this process may use %.1f GiB (< %.0f GiB); "
                    "set trainer.cpu_allocator=glibc for the fastest steps", limit / 2**30, AUTO_JEMALLOC_BELOW_GIB)
        return "jemalloc"
    return "glibc"


def cpu_openmp_env(environ: Mapping[str, str]) -> dict[str, str]:
    """OpenMP waiting for CPU workers: the user's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` when
    either is set (``OMP_WAIT_POLICY=`` restores the runtime's default), else a short spin."""
    chosen = {k: environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ}
    return chosen or {"GOMP_SPINCOUNT": CPU_OPENMP_SPINCOUNT}


def cpu_malloc_env(environ: Mapping[str, str], allocator: str = "glibc",
                   limit_bytes: Optional[int] = None) -> dict[str, str]:
    """The allocator of CPU workers: ``jemalloc`` (Ray's copy, where found) with
    :data:`JEMALLOC_CONF`, else glibc with :data:`CPU_MALLOC_ENV` (``auto``: by the memory limit,
    :func:`resolve_cpu_allocator`); unless the user configures the allocator: any ``MALLOC_*``
    variable, ``GLIBC_TUNABLES`` or ``LD_PRELOAD`` (e.g. tcmalloc or their own jemalloc) is passed
    on instead."""
    _check_allocator(allocator)
    chosen = {k: v for k, v in environ.items() if k.startswith("MALLOC_") or k in _ALLOCATOR_KEYS}
    if chosen:
        return chosen
    allocator = resolve_cpu_allocator(allocator, limit_bytes)
    if allocator == "jemalloc":
        path = bundled_jemalloc()
        if path:
            return {"LD_PRELOAD": path, "MALLOC_CONF": JEMALLOC_CONF}
        logger.warning("trainer.cpu_allocator (jemalloc): Ray's bundled libjemalloc.so was not found; "
                       "the workers use glibc (set LD_PRELOAD to a jemalloc library to use it).")
    return dict(CPU_MALLOC_ENV)


def cpu_worker_env(environ: Mapping[str, str], allocator: str = "glibc") -> dict[str, str]:
    """Environment variables for CPU worker processes: OpenMP waiting and the memory allocator."""
    return {**cpu_openmp_env(environ), **cpu_malloc_env(environ, allocator)}
