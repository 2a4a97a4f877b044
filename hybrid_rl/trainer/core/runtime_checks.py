"""The run's runtime checks: what the config alone cannot say, checked before any worker starts.

The config checks (:mod:`hybrid_rl.trainer.config.run_checks` and each mode's) read configs and the
files they name; these read the run's state on disk: whether the run folder
(``trainer.default_local_dir``) can be created and written, and whether the checkpoint a resume
would load exists, is complete and fits this run. :class:`~hybrid_rl.trainer.core.loop.TrainerCore`
runs them right after the config checks, and ``--cfg job`` runs them too (it runs the run's checks,
docs/reliability.md), so both refuse the same input with the same line.
"""

from __future__ import annotations

from typing import Any, Callable

from hybrid_rl.trainer.config.run_checks import RESUME_MODES, raise_problems, run_dir, unwritable, world_size_problems
from hybrid_rl.trainer.core.run_config import RunConfig

__all__ = ["check_run_state", "check_resume", "run_dir_problems", "run_state_problems"]

PointProblems = Callable[[Any, Any], list[str]]
"""``(config, resume point) -> problems``: why a mode cannot load a checkpoint (empty: it fits)."""


def run_dir_problems(cfg: RunConfig) -> list[str]:
    """``trainer.default_local_dir`` can be created and written (checkpoints, metrics, logs)."""
    key, value = "trainer.default_local_dir", cfg.trainer.default_local_dir
    why = unwritable(run_dir(cfg))
    return [] if why is None else [f"{key}={value!r} cannot hold the run's files: {why}. Fix: point {key} at a "
                                   "folder you can write (it is created if missing)."]


def check_resume(cfg: RunConfig, point_problems: PointProblems = world_size_problems) -> list[str]:
    """The checkpoint a resume would load exists, is complete and fits this run (``point_problems``:
    the mode's reasons it may not)."""
    from hybrid_rl.trainer.core.checkpoints import CheckpointManager

    t = cfg.trainer
    if t.resume_mode not in RESUME_MODES or (t.resume_mode == "resume_path" and not t.resume_from_path):
        return []  # the config checks report it (check_trainer)
    try:
        point = CheckpointManager(t.default_local_dir).resolve_resume(t.resume_mode, t.resume_from_path)
    except (ValueError, OSError) as error:
        return [f"{error} (trainer.resume_mode={t.resume_mode})"]
    return [] if point is None else point_problems(cfg, point)


def run_state_problems(cfg: RunConfig, point_problems: PointProblems = world_size_problems, *,
                       training: bool = True) -> list[str]:
    """Every runtime problem of the run ``cfg`` (``training=False``: a run that only generates and
    scores loads no checkpoint, so its resume point is not checked)."""
    return run_dir_problems(cfg) + (check_resume(cfg, point_problems) if training else [])


def check_run_state(cfg: RunConfig, point_problems: PointProblems = world_size_problems, *,
                    training: bool = True) -> None:
    """Raise one ValueError listing :func:`run_state_problems` (nothing when there are none)."""
    raise_problems(run_state_problems(cfg, point_problems, training=training))
