"""Command line and notebook entry points of the trainer.

    python -m hybrid_rl.trainer.main_ppo                       # the default run (GRPO, arithmetic)
    python -m hybrid_rl.trainer.main_ppo data.train_batch_size=8 trainer.total_training_steps=5

    from hybrid_rl.trainer import get_config, run_ppo          # notebook
    run_ppo(get_config(["trainer.total_training_steps=5"]))

User mistakes (unknown key, wrong type, inconsistent values, bad data or reward files, a missing
model or checkpoint, an unreachable Ray cluster) end the command with ONE line on stderr,
``hybrid_rl config error: <what is wrong and how to fix it>``, and exit status 2. Most are caught
on the driver before Ray starts; a ``ValueError`` raised later inside a worker (Ray wraps it in
``RayTaskError`` / ``ActorDiedError``) is unwrapped to its message. Set ``HYBRID_RL_FULL_ERROR=1``
to get the full traceback instead. Anything that is not a user mistake (a bug) keeps its traceback.
"""

from __future__ import annotations

from typing import Optional, Union

from omegaconf import DictConfig

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.modes import CONFIG_ERROR_EXIT_CODE, FULL_ERROR_ENV, run_config, run_mode, user_error_message
from hybrid_rl.trainer.ppo.preflight import (check_agent_config, check_agent_names, check_experience_buffer,
                                              check_reward_coverage, check_teacher_keys)

__all__ = ["CONFIG_ERROR_EXIT_CODE", "FULL_ERROR_ENV", "build_trainer", "config_notices", "get_config", "main",
           "run_ppo", "user_error_message"]


def build_trainer(cfg: Union[DictConfig, PPOConfig], trainer_cls: Optional[type] = None, *,
                  for_training: bool = True):
    """Validate ``cfg`` and build the trainer (datasets, reward, tokenizer); workers not started.
    Default class: :class:`DecoupledPPOTrainer` with ``async_training.enable``, else :class:`RayPPOTrainer`.
    ``for_training=False``: only generate and score (``eval``, ``debug``), so the update's settings are
    not checked."""
    cfg = to_ppo_config(cfg)
    if trainer_cls is None and cfg.async_training.enable:
        from hybrid_rl.trainer.ppo.decoupled import DecoupledPPOTrainer as trainer_cls
    elif trainer_cls is None:
        from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer as trainer_cls

    trainer = trainer_cls(cfg) if for_training else trainer_cls(cfg, for_training=False)
    check_reward_coverage(trainer.config, trainer.train_dataset, trainer.val_dataset)
    check_agent_config(trainer.config, trainer.tokenizer)
    check_agent_names(trainer.config, trainer.train_dataset, trainer.val_dataset)
    if for_training:  # the database before Ray and the workers: one line, not a traceback after them
        check_experience_buffer(trainer.config, trainer.run_dir)
        check_teacher_keys(trainer.config, trainer.train_dataset)  # on the workers: a hang, not one line
    return trainer


def run_ppo(cfg: Union[DictConfig, PPOConfig], trainer_cls: Optional[type] = None) -> dict[str, float]:
    """Run a whole training job described by ``cfg``; returns the last step's metrics.

    The reward is computed in this process, so a scorer registered here with
    ``@hybrid_rl.reward.register_reward`` (e.g. in a notebook cell) is used. The workers are
    stopped at the end; Ray itself stays up for the next run.
    """
    return run_config("ppo", cfg, trainer_cls)


def config_notices(cfg: PPOConfig, overrides: list[str]) -> list[str]:
    """The run's advice on veRL's defaults and recommended settings (logged when it starts)."""
    from hybrid_rl.trainer.config.verl_compat import recommended_setting_notices, verl_default_notices

    return verl_default_notices(cfg, overrides) + recommended_setting_notices(cfg, overrides)


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_ppo [key=value ...]`` (Hydra command line)."""
    run_mode("ppo", argv)


if __name__ == "__main__":
    main()
