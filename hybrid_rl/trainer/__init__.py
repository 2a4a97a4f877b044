"""The trainer: Hydra config, the modes (:data:`MODES`: ppo, sft, rm) and their one entry path (:func:`run_mode`).

Notebook API::

    from hybrid_rl.trainer import get_config, run_ppo, RayPPOTrainer
    cfg = get_config(["trainer.total_training_steps=5"])
    run_ppo(cfg)

Attributes are imported lazily so ``import hybrid_rl.trainer`` does not pull in Ray or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "get_config": "hybrid_rl.trainer.config.loader",
    "to_ppo_config": "hybrid_rl.trainer.config.loader",
    "PPOConfig": "hybrid_rl.trainer.config",
    "validate_config": "hybrid_rl.trainer.config.checks",
    "RayPPOTrainer": "hybrid_rl.trainer.ppo.trainer",
    "DecoupledPPOTrainer": "hybrid_rl.trainer.ppo.decoupled",
    "run_ppo": "hybrid_rl.trainer.main_ppo",
    "run_sft": "hybrid_rl.trainer.main_sft",
    "run_rm": "hybrid_rl.trainer.main_rm",
    "MODES": "hybrid_rl.trainer.modes",
    "run_mode": "hybrid_rl.trainer.modes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybrid_rl.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
