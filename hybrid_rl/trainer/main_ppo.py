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

import logging
import os
import re
import sys
from typing import Optional, Union

from omegaconf import DictConfig

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.loader import CONFIG_DIR, CONFIG_NAME, check_override_keys, get_config, to_ppo_config
from hybrid_rl.trainer.config.verl_compat import recommended_setting_notices, verl_default_notices
from hybrid_rl.trainer.core.single_process import reexec_for_single_process, resolve_single_process
from hybrid_rl.trainer.ppo.preflight import (check_agent_config, check_agent_names, check_experience_buffer,
                                              check_reward_coverage, check_teacher_keys)
from hybrid_rl.utils.log_setup import recorded_config_notices

logger = logging.getLogger(__name__)

CONFIG_ERROR_EXIT_CODE = 2
FULL_ERROR_ENV = "HYBRID_RL_FULL_ERROR"
"""Set to 1 to see the traceback of a user error instead of its one-line message."""

__all__ = ["get_config", "run_ppo", "main"]


def _configure_driver_logging(cfg: Union[DictConfig, PPOConfig], always: bool) -> None:
    """The quiet console of ``trainer.log_level`` and ``<run>/logs/driver.log``
    (hybrid_rl/utils/log_setup.py). From a notebook (``always=False``) only when the caller
    configured no logging at all: a user's own logging set-up is left as it is."""
    from hybrid_rl.trainer.config.run_checks import raise_problems, run_dir, run_dir_problems
    from hybrid_rl.utils.log_setup import configure_logging, only_own_handlers

    if always or (only_own_handlers() and not logging.getLogger("hybrid_rl").handlers):
        cfg = to_ppo_config(cfg)
        raise_problems(run_dir_problems(cfg))  # one line, not the log file's FileNotFoundError
        configure_logging(cfg.trainer.log_level, os.path.join(run_dir(cfg), "logs", "driver.log"))


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
    from hybrid_rl.trainer.core.supervisor import run_supervised

    cfg = to_ppo_config(cfg)  # once: its deprecation notices are given once
    _configure_driver_logging(cfg, always=False)
    trainer = build_trainer(cfg, trainer_cls)
    # Stops the workers at the end; restarts them after a worker failure per trainer.max_restarts.
    return run_supervised(trainer, lambda config: build_trainer(config, trainer_cls))


def _override_args(argv: list[str]) -> list[str]:
    """The key=value overrides among Hydra's command-line arguments (flags like --cfg excluded)."""
    return [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def user_error_message(error: BaseException) -> Optional[str]:
    """The message of a user mistake (a ``ValueError``), also when Ray wrapped it; None otherwise.

    A ValueError raised in a worker method arrives as ``RayTaskError`` (its ``cause`` is the
    original); one raised in a worker constructor kills the actor and only its text survives in
    the ``ActorDiedError`` (possibly itself the cause of a ``WorkerGroupError``).
    """
    from ray.exceptions import RayActorError, RayTaskError

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RayTaskError):
            error = error.cause
            continue
        if isinstance(error, ValueError):
            return str(error)
        if isinstance(error, RayActorError) and error.actor_init_failed:
            return _value_error_in_text(str(error))
        error = error.__cause__
    return None


def _value_error_in_text(text: str) -> Optional[str]:
    """The message of the last ``ValueError: ...`` of a remote traceback text (None if there is none)."""
    matches = re.findall(r"^ValueError: (.*?)(?=\n\S+Error: |\Z)", text, flags=re.M | re.S)
    return matches[-1].strip() if matches else None


def _fail(error: BaseException) -> None:
    # One line on stderr and a distinct exit status: a user mistake is not a crash.
    sys.stderr.flush()
    from hybrid_rl.utils.redact import redact_text

    sys.stderr.write(f"hybrid_rl config error: {redact_text(str(user_error_message(error) or error))}\n")
    sys.stderr.flush()
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def _is_reported_user_error(error: BaseException) -> bool:
    """True if ``error`` is a user mistake to report in one line (not with HYBRID_RL_FULL_ERROR=1)."""
    return os.environ.get(FULL_ERROR_ENV) != "1" and user_error_message(error) is not None


def _hydra_task(cfg: DictConfig, command_line: bool = False) -> None:
    """The run behind the command line; ``command_line``: this process was started for it (not
    ``main(argv)`` called from Python), so ``trainer.single_process`` may be chosen for it."""
    trainer = None
    try:
        from hybrid_rl.trainer.core.supervisor import run_supervised

        with recorded_config_notices() as deprecated:  # deprecated keys: plain lines, as the notices below
            cfg = to_ppo_config(cfg)
        _configure_driver_logging(cfg, always=True)
        overrides = _override_args(sys.argv[1:])
        for notice in deprecated + verl_default_notices(cfg, overrides) + recommended_setting_notices(cfg, overrides):
            logger.warning(notice)
        trainer = build_trainer(resolve_single_process(cfg) if command_line else cfg)
        run_supervised(trainer, build_trainer)  # trainer.max_restarts: restart after a worker failure
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        user_error = _is_reported_user_error(error)
        if user_error:
            # The other workers failed the same way; Ray would print their tracebacks at exit
            # ("Unhandled error") after our one line. Ray reads this variable when it prints.
            os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        if trainer is not None:
            trainer.shutdown()
            trainer = None
        if user_error:
            _fail(error)
        raise
    finally:
        if trainer is not None:
            trainer.shutdown()


USAGE = ("usage: python -m hybrid_rl.trainer.main_ppo [key=value ...] [--cfg job] [--config-path DIR "
         "--config-name NAME]")
INTRO = ("RL training of the PPO family (PPO, GRPO, RLOO, REINFORCE++, ReMax and any registered estimator), "
         "colocated or decoupled. Every key below is set as key=value on the command line (veRL's names); the "
         "value shown is the one this command line gets. --cfg job prints the resolved config as YAML after the "
         "run's config checks (a bad value gets the run's one-line error; no model is loaded, Ray is not started).")


def print_help(overrides: list[str]) -> None:
    """Every key with its value under ``overrides`` and its documentation (``--help``)."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.docs import config_help

    composed = OmegaConf.to_container(get_config(overrides), resolve=False)
    composed.pop("hydra", None)
    sys.stdout.write(config_help(PPOConfig, composed, USAGE, INTRO, registry_notes()))


def registry_notes() -> dict[str, list[str]]:
    """The registered estimators, losses and reward managers under the keys that pick them."""
    from hybrid_rl.algorithms import describe_adv_estimators, describe_policy_losses
    from hybrid_rl.reward import registered_reward_managers

    def needs(info) -> str:
        flags = [name.replace("_", " ") for name, value in vars(info).items()
                 if name.startswith("needs_") and value is True]
        return f" [{', '.join(flags)}]" if flags else ""

    return {
        "algorithm.adv_estimator": [f"{name}{needs(i)}: {i.description}" for name, i in describe_adv_estimators().items()],
        "actor_rollout_ref.actor.policy_loss.loss_mode": [f"{name}{needs(i)}: {i.description}"
                                                          for name, i in describe_policy_losses().items()],
        "reward_model.reward_manager": [f"registered: {', '.join(registered_reward_managers())}"],
    }


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_ppo [key=value ...]`` (Hydra command line)."""
    import hydra

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    overrides = _override_args(sys.argv[1:])
    try:
        if {"--help", "-h"} & set(sys.argv[1:]):  # Hydra's own help shows no documentation
            print_help([o for o in overrides if not o.lstrip("+~").startswith("hydra.")])
            return
        check_override_keys(overrides)
        # Compose once outside Hydra's app runner, which would print a multi-line report and a
        # HYDRA_FULL_ERROR hint for a wrong type instead of one line.
        with recorded_config_notices() as deprecated:  # a run prints them with its own composition (_hydra_task)
            cfg = to_ppo_config(get_config([o for o in overrides if not o.lstrip("+~").startswith("hydra.")]))
        print_only = bool({"--cfg", "-c"} & set(sys.argv[1:]))  # Hydra prints the config and runs no task
        if print_only:
            sys.stderr.write("".join(notice + "\n" for notice in deprecated))
        if argv is None:
            cfg = resolve_single_process(cfg)
        if print_only:  # the run's own checks, none that loads a model or starts Ray
            from hybrid_rl.trainer.config.checks import validate_config

            validate_config(cfg)
    except ValueError as error:
        _fail(error)
    command_line = argv is None
    if command_line and cfg.trainer.single_process:
        # This process hosts the worker: start it over with the worker's allocator and logging set.
        reexec_for_single_process(cfg)

    def hydra_task(config: DictConfig) -> None:
        _hydra_task(config, command_line)

    from hybrid_rl.utils.redact import redacted_console

    task = hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base="1.3")(hydra_task)
    if not any(a.lstrip("+~").startswith("hydra.output_subdir=") for a in sys.argv[1:]):
        # No .hydra/{config,overrides}.yaml copy of the overrides (a database password) for a user's YAML
        # that lacks the package's hydra section.
        # Beside the other overrides: argparse takes them as one run (``k=v --cfg job`` + k2=v2 fails).
        first = next((i for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("-") and "=" in a), None)
        sys.argv.insert(len(sys.argv) if first is None else first + 1, "hydra.output_subdir=null")
    with redacted_console():  # Hydra's "Error executing job with overrides: [...]" and --cfg print
        task()


if __name__ == "__main__":
    main()
