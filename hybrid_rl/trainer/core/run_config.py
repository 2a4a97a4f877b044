"""The base config the trainer core is typed against: the sections every mode's config has.

A mode's config (PPO's, SFT's, the reward model's, ...) is any dataclass with these sections; the core reads nothing else of it by name. A
mode that reserves worker pools beside the training group says so with an ``own_pools()`` method
(one phrase naming the key of each, e.g. PPO's decoupled rollout pool): a single-process run
cannot host them (:func:`hybrid_rl.trainer.config.run_checks.single_process_blockers`).
"""

from __future__ import annotations

from typing import Any, Protocol

from hybrid_rl.trainer.config.schema import BaseTrainerConfig, RayInitConfig

__all__ = ["RunConfig"]


class RunConfig(Protocol):
    """What the core reads of every mode's config."""

    trainer: BaseTrainerConfig
    """Run length, devices, logging, checkpoints, restarts (``trainer.*``)."""
    ray_init: RayInitConfig
    """Where Ray runs (``ray_init.*``)."""
    data: Any
    """The mode's data section: ``train_files``, ``val_files``, ``train_batch_size``, ``arithmetic`` (the default task)."""
