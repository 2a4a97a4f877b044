"""The command line of the supervised modes (``main_sft``, ``main_rm``), speaking as ``main_ppo`` does.

    python -m hybrid_rl.trainer.main_sft [key=value ...]            # run
    python -m hybrid_rl.trainer.main_sft --help [key=value ...]     # every key, its value and documentation
    python -m hybrid_rl.trainer.main_sft --cfg job [key=value ...]  # the resolved config as YAML, once checked
    python -m hybrid_rl.trainer.main_sft --config-path DIR --config-name NAME [key=value ...]

The keys are the mode's own dataclass's (:class:`~hybrid_rl.trainer.config.supervised.SFTConfig`,
:class:`~hybrid_rl.trainer.config.supervised.RMConfig`), composed by Hydra over its schema like
``main_ppo``'s; a YAML given with ``--config-path/--config-name`` lists the schema in its defaults
(``defaults: [sft_trainer_schema, _self_]``). A user mistake ends in one line and exit status 2.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from hybrid_rl.trainer.config.loader import ConfigSchema

__all__ = ["SupervisedMode", "compose", "run_cli", "run_mode"]


@dataclass(frozen=True)
class SupervisedMode:
    """What a supervised entry point composes, says and runs."""

    schema: ConfigSchema
    """Its config: the YAML and the dataclass under it."""
    summary: str
    """One sentence on what the command trains (the head of ``--help``)."""
    trainer: Callable[[], type]
    """The trainer class (imported when a run starts, so ``--help`` stays light)."""


def compose(mode: SupervisedMode, overrides: Sequence[str], config_dir: Optional[str] = None,
            config_name: Optional[str] = None) -> Any:
    """The mode's typed config of ``overrides`` (over a user's YAML when ``config_dir`` is given)."""
    from hybrid_rl.trainer.config.loader import get_config, to_typed_config

    return to_typed_config(get_config(list(overrides), mode.schema, config_dir, config_name), mode.schema.node)


def run_mode(mode: SupervisedMode, config: Any) -> dict[str, float]:
    """Train ``config`` (typed or composed) to the end; returns the last step's metrics."""
    from hybrid_rl.trainer.core.supervisor import run_supervised

    trainer_cls = mode.trainer()
    return run_supervised(trainer_cls(config), trainer_cls)


def _help(mode: SupervisedMode, overrides: list[str], config_dir: Optional[str], config_name: Optional[str]) -> str:
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.docs import config_help
    from hybrid_rl.trainer.config.loader import get_config

    composed = OmegaConf.to_container(get_config(overrides, mode.schema, config_dir, config_name), resolve=False)
    composed.pop("hydra", None)
    usage = (f"usage: python -m hybrid_rl.trainer.{mode.schema.module} [key=value ...] [--cfg job] "
             "[--config-path DIR --config-name NAME]")
    intro = (f"{mode.summary} Every key below is set as key=value (veRL's SFT trainer names); the value shown "
             "is the one this command line gets. --cfg job prints the resolved config as YAML after the run's "
             "config checks (a bad value gets the run's one-line error; no model is loaded).")
    return config_help(mode.schema.node, composed, usage, intro)


def _parse(argv: Sequence[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """``(key=value overrides, {--config-path, --config-name, --cfg: value}, other flags)``."""
    overrides, options, flags = [], {}, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("--config-path", "--config-name", "--cfg", "-cp", "-cn", "-c"):
            long = {"-cp": "--config-path", "-cn": "--config-name", "-c": "--cfg"}.get(name, name)
            options[long] = value if eq else (args.pop(0) if args else "")
        elif arg.startswith("-"):
            flags.append(arg)
        elif not eq:
            raise ValueError(f"cannot parse {arg!r}: write key=value (e.g. optim.lr=1e-5).")
        else:
            overrides.append(arg)
    return overrides, options, flags


def run_cli(argv: Sequence[str], mode: SupervisedMode, command_line: bool = False) -> None:
    """Parse ``argv``, then answer ``--help`` / ``--cfg job`` or run with the console and
    ``<run>/logs/driver.log`` set up as ``main_ppo`` sets them. ``command_line``: this process was
    started for the run (``python -m ...``), so, as ``main_ppo``, a run of one worker that needs
    nothing only Ray gives hosts it in this process (``trainer.single_process`` null = auto)."""
    from hybrid_rl.trainer.config.run_checks import raise_problems, run_dir, run_dir_problems
    from hybrid_rl.trainer.main_ppo import _fail, _is_reported_user_error
    from hybrid_rl.utils.log_setup import configure_logging, recorded_config_notices

    try:
        overrides, options, flags = _parse(argv)
        config_dir, config_name = options.get("--config-path"), options.get("--config-name")
        if bool(config_dir) != bool(config_name):
            raise ValueError("--config-path DIR and --config-name NAME go together (the YAML is DIR/NAME.yaml).")
        if {"--help", "-h"} & set(flags):
            sys.stdout.write(_help(mode, overrides, config_dir, config_name))
            return
        if flags or options.get("--cfg", "job") != "job":
            raise ValueError(f"unknown flag(s) {flags or ['--cfg ' + options['--cfg']]}: this command takes key=value "
                             "settings, --help, --cfg job and --config-path DIR --config-name NAME.")
        with recorded_config_notices() as deprecated:
            cfg = compose(mode, overrides, config_dir, config_name)
        if "--cfg" in options:
            from omegaconf import OmegaConf

            from hybrid_rl.trainer.config.loader import to_container
            from hybrid_rl.trainer.config.supervised_checks import validate_supervised_config

            sys.stderr.write("".join(notice + "\n" for notice in deprecated))
            validate_supervised_config(cfg)  # the run's own checks, none that loads a model or starts Ray
            from hybrid_rl.utils.redact import redact_config

            sys.stdout.write(OmegaConf.to_yaml(redact_config(to_container(cfg))))  # a console: no passwords
            return
        if command_line:
            from hybrid_rl.trainer.core.single_process import reexec_for_single_process, resolve_single_process

            cfg = resolve_single_process(cfg)
            if cfg.trainer.single_process:  # the worker's allocator and logging set from the start
                reexec_for_single_process(cfg)
        if not logging.getLogger().handlers:  # the console main_ppo gets from Hydra: messages only
            console = logging.StreamHandler(sys.stdout)
            console.setFormatter(logging.Formatter("%(message)s"))
            logging.getLogger().addHandler(console)
        raise_problems(run_dir_problems(cfg))  # one line, not the log file's FileNotFoundError
        configure_logging(cfg.trainer.log_level, os.path.join(run_dir(cfg), "logs", "driver.log"))
        for notice in deprecated:
            logging.getLogger("hybrid_rl").warning(notice)
        run_mode(mode, cfg)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        if _is_reported_user_error(error):
            _fail(error)
        raise
