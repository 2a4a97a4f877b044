"""Command line and notebook entry points of the trainer.

    python -m hybrid_rl.trainer.main_ppo                       # the default run (GRPO, arithmetic)
    python -m hybrid_rl.trainer.main_ppo data.train_batch_size=8 trainer.total_training_steps=5

    from hybrid_rl.trainer import get_config, run_ppo          # notebook
    run_ppo(get_config(["trainer.total_training_steps=5"]))

Configuration mistakes (unknown key, wrong type, inconsistent values) end the command with one
error line and exit status 2, before any worker starts.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Union

from omegaconf import DictConfig

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config_loader import CONFIG_NAME, check_override_keys, get_config, to_ppo_config

logger = logging.getLogger(__name__)

CONFIG_ERROR_EXIT_CODE = 2

__all__ = ["get_config", "run_ppo", "main"]


def _ensure_logging() -> None:
    """Show hybrid_rl's INFO logs when the caller configured no logging at all (notebooks)."""
    if not logging.getLogger().handlers and not logging.getLogger("hybrid_rl").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        package_logger = logging.getLogger("hybrid_rl")
        package_logger.addHandler(handler)
        package_logger.setLevel(logging.INFO)


def build_trainer(cfg: Union[DictConfig, PPOConfig], trainer_cls: Optional[type] = None):
    """Validate ``cfg`` and build the trainer (datasets, reward, tokenizer); workers not started."""
    from hybrid_rl.trainer.ray_trainer import RayPPOTrainer

    return (trainer_cls or RayPPOTrainer)(to_ppo_config(cfg))


def run_ppo(cfg: Union[DictConfig, PPOConfig], trainer_cls: Optional[type] = None) -> dict[str, float]:
    """Run a whole training job described by ``cfg``; returns the last step's metrics.

    The reward is computed in this process, so a scorer registered here with
    ``@hybrid_rl.reward.register_reward`` (e.g. in a notebook cell) is used. The workers are
    stopped at the end; Ray itself stays up for the next run.
    """
    _ensure_logging()
    trainer = build_trainer(cfg, trainer_cls)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.shutdown()


def _override_args(argv: list[str]) -> list[str]:
    """The key=value overrides among Hydra's command-line arguments (flags like --cfg excluded)."""
    return [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def _fail(error: ValueError) -> None:
    # One line on stderr and a distinct exit status: a config mistake is not a crash.
    sys.stderr.write(f"hybrid_rl config error: {error}\n")
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def _hydra_task(cfg: DictConfig) -> None:
    try:
        trainer = build_trainer(cfg)
    except ValueError as error:
        _fail(error)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.shutdown()


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_ppo [key=value ...]`` (Hydra command line)."""
    import hydra

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        check_override_keys(_override_args(sys.argv[1:]))
    except ValueError as error:
        _fail(error)
    task = hydra.main(config_path="config", config_name=CONFIG_NAME, version_base="1.3")(_hydra_task)
    task()


if __name__ == "__main__":
    main()
