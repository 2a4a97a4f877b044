"""OpenMP waiting policy for CPU workers (torch-free: set it before torch loads OpenMP).

``GOMP_SPINCOUNT`` is how many iterations a GNU OpenMP thread (torch's runtime on Linux) spins
before it sleeps. Measured with vLLM generation on 2 cores (docs/rollout.md), tok/s: the OpenMP
default (300k spins) gave 677 quiet but 133 beside one busy process; never spinning
(``OMP_WAIT_POLICY=PASSIVE``) 470 quiet and 322 beside it; 1000 spins 600 quiet and 281 beside it.
"""

from __future__ import annotations

from typing import Mapping

CPU_OPENMP_SPINCOUNT = "1000"
"""Spin iterations before a waiting OpenMP thread sleeps (see the module docstring)."""


def cpu_openmp_env(environ: Mapping[str, str]) -> dict[str, str]:
    """OpenMP waiting for CPU workers: the user's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` when
    either is set (``OMP_WAIT_POLICY=`` restores the runtime's default), else a short spin."""
    chosen = {k: environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ}
    return chosen or {"GOMP_SPINCOUNT": CPU_OPENMP_SPINCOUNT}
