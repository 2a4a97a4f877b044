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
  size classes fragment less. It never returns memory by itself (``dirty_decay_ms:-1``: its default
  10 s decay purged pages while an update still churned through them, +35-40% update time in the
  default run); instead every worker phase ends by purging all arenas
  (:func:`hybrid_rl.utils.memory.release_free_memory`), so one phase's freed working set is returned
  before the next one fragments around it. The default run's tree then peaks at 4.8 instead of
  6.3 GiB (glibc) at the same update time (docs/memory.md). ``oversize_threshold:0`` keeps blocks
  above 8 MiB in the normal arenas instead of a dedicated one.
- ``auto`` (the default): jemalloc where Ray's copy is found (Linux), glibc otherwise. Measured
  side by side (docs/memory.md): the same step time as glibc within the noise, 0.8-1.5 GiB less.
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

JEMALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"
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


def _check_allocator(allocator: str) -> None:
    if allocator not in CPU_ALLOCATORS:
        raise ValueError(f"trainer.cpu_allocator={allocator!r} is invalid: must be one of {CPU_ALLOCATORS}. "
                         "Fix: use auto (jemalloc where Ray ships it), glibc or jemalloc.")


def resolve_cpu_allocator(allocator: str) -> str:
    """``glibc`` or ``jemalloc`` for ``trainer.cpu_allocator``; ``auto`` = jemalloc (see the module
    docstring)."""
    _check_allocator(allocator)
    return "jemalloc" if allocator == "auto" else allocator


def cpu_openmp_env(environ: Mapping[str, str]) -> dict[str, str]:
    """OpenMP waiting for CPU workers: the user's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` when
    either is set (``OMP_WAIT_POLICY=`` restores the runtime's default), else a short spin."""
    chosen = {k: environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ}
    return chosen or {"GOMP_SPINCOUNT": CPU_OPENMP_SPINCOUNT}


def cpu_malloc_env(environ: Mapping[str, str], allocator: str = "glibc") -> dict[str, str]:
    """The allocator of CPU workers: ``jemalloc`` (Ray's copy, where found) with
    :data:`JEMALLOC_CONF`, else glibc with :data:`CPU_MALLOC_ENV`; unless the user configures the
    allocator: any ``MALLOC_*`` variable, ``GLIBC_TUNABLES`` or ``LD_PRELOAD`` (e.g. tcmalloc or
    their own jemalloc) is passed on instead."""
    chosen = {k: v for k, v in environ.items() if k.startswith("MALLOC_") or k in _ALLOCATOR_KEYS}
    if chosen:
        _check_allocator(allocator)
        return chosen
    resolved = resolve_cpu_allocator(allocator)
    if resolved == "jemalloc":
        path = bundled_jemalloc()
        if path:
            return {"LD_PRELOAD": path, "MALLOC_CONF": JEMALLOC_CONF}
        if allocator == "jemalloc":  # asked for by name: say why it is not used
            logger.warning("trainer.cpu_allocator=jemalloc: Ray's bundled libjemalloc.so was not found; the "
                           "workers use glibc (set LD_PRELOAD to a jemalloc library to use it).")
    return dict(CPU_MALLOC_ENV)


def cpu_worker_env(environ: Mapping[str, str], allocator: str = "glibc") -> dict[str, str]:
    """Environment variables for CPU worker processes: OpenMP waiting and the memory allocator."""
    return {**cpu_openmp_env(environ), **cpu_malloc_env(environ, allocator)}
