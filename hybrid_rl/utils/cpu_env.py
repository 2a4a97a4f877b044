"""Process environment for CPU workers (torch-free: it must be set before the worker starts).

OpenMP waiting. ``GOMP_SPINCOUNT`` is how many iterations a GNU OpenMP thread (torch's runtime on
Linux) spins before it sleeps. Measured with vLLM generation on 2 cores (docs/rollout.md), tok/s:
the OpenMP default (300k spins) gave 677 quiet but 133 beside one busy process; never spinning
(``OMP_WAIT_POLICY=PASSIVE``) 470 quiet and 322 beside it; 1000 spins 600 quiet and 281 beside it.

Memory allocator. glibc serves large blocks (activations, logits, gradients) with fresh ``mmap``
pages and returns them to the kernel on free, so every training step faults its whole activation
footprint back in: ~400k minor page faults per update at ``benchmarks/bench_step.py``'s shape,
~1 s of a 4-5 s update (docs/performance.md). CPU workers therefore keep freed memory for reuse,
as the CUDA caching allocator does and as Intel's PyTorch launcher configures jemalloc: no
``mmap``-served blocks and no trimming of the heap. The process keeps its peak footprint.
"""

from __future__ import annotations

from typing import Mapping

CPU_OPENMP_SPINCOUNT = "1000"
"""Spin iterations before a waiting OpenMP thread sleeps (see the module docstring)."""

CPU_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
"""glibc malloc settings that keep freed memory in the process (see the module docstring)."""

_ALLOCATOR_KEYS = ("LD_PRELOAD", "GLIBC_TUNABLES")


def cpu_openmp_env(environ: Mapping[str, str]) -> dict[str, str]:
    """OpenMP waiting for CPU workers: the user's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` when
    either is set (``OMP_WAIT_POLICY=`` restores the runtime's default), else a short spin."""
    chosen = {k: environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ}
    return chosen or {"GOMP_SPINCOUNT": CPU_OPENMP_SPINCOUNT}


def cpu_malloc_env(environ: Mapping[str, str]) -> dict[str, str]:
    """:data:`CPU_MALLOC_ENV`, unless the user configures the allocator: any ``MALLOC_*`` variable,
    ``GLIBC_TUNABLES`` or ``LD_PRELOAD`` (e.g. tcmalloc or jemalloc) is passed on instead."""
    chosen = {k: v for k, v in environ.items() if k.startswith("MALLOC_") or k in _ALLOCATOR_KEYS}
    return chosen or dict(CPU_MALLOC_ENV)


def cpu_worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables for CPU worker processes: OpenMP waiting and the memory allocator."""
    return {**cpu_openmp_env(environ), **cpu_malloc_env(environ)}
