"""The supervised modes' command line (``main_sft``, ``main_rm``) by its former names: every entry
point now runs :func:`hybrid_rl.trainer.modes.run_mode`, so these are that module's functions.

    python -m hybrid_rl.trainer.main_sft [key=value ...]            # run
    python -m hybrid_rl.trainer.main_sft --help [key=value ...]     # every key, its value and documentation
    python -m hybrid_rl.trainer.main_sft --cfg job [key=value ...]  # the resolved config as YAML, once checked
    python -m hybrid_rl.trainer.main_sft --config-path DIR --config-name NAME [key=value ...]

A YAML given with ``--config-path/--config-name`` lists the mode's schema in its defaults
(``defaults: [sft_trainer_schema, _self_]``). A user mistake ends in one line and exit status 2.
"""

from __future__ import annotations

from typing import Any, Sequence

from hybrid_rl.trainer.modes import ModeSpec, compose, parse_args, run_config
from hybrid_rl.trainer.modes import run_mode as _run_mode_named

__all__ = ["SupervisedMode", "compose", "run_cli", "run_mode"]

SupervisedMode = ModeSpec
"""A supervised mode's row of :data:`hybrid_rl.trainer.modes.MODES`."""

_parse = parse_args


def run_mode(mode: ModeSpec, config: Any) -> dict[str, float]:
    """Train ``config`` (typed or composed) of ``mode`` to the end; returns the last step's metrics."""
    return run_config(mode.name, config)


def run_cli(argv: Sequence[str], mode: ModeSpec, command_line: bool = False) -> None:
    """``mode``'s command line on ``argv`` (``command_line``: this process was started for it)."""
    _run_mode_named(mode.name, None if command_line else list(argv))
