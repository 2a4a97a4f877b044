"""Seeding the process-global random generators (Python's, NumPy's, torch's on every device).

The driver seeds its own with ``trainer.seed`` when a run starts. A worker under Ray starts with
generators Ray left seeded from the clock, so dropout, or anything else a model or loss draws from
them, would differ between two runs of one seed; a worker group therefore passes ``trainer.seed`` in
:data:`WORKER_SEED_ENV` and each rank seeds its generators with ``seed + rank`` when it starts
(:func:`seed_worker`), as OpenRLHF and TRL seed their processes. Checkpoints save and restore the
streams, so a resumed run continues them.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["WORKER_SEED_ENV", "seed_everything", "seed_worker"]

WORKER_SEED_ENV = "HYBRID_RL_SEED"
"""The run's ``trainer.seed``, set by the worker group in each worker's environment."""


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (torch's also seeds every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_worker(rank: int) -> bool:
    """Seed this worker's generators with ``$HYBRID_RL_SEED + rank``; False when the variable is unset."""
    value = os.environ.get(WORKER_SEED_ENV)
    if value is None:
        return False
    seed_everything(int(value) + rank)
    return True
