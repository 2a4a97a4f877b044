"""Run a trainer to the end, restarting its workers after a worker failure (``trainer.max_restarts``).

A worker that dies (OOM kill, segfault, SIGKILL) or stops answering within
``trainer.worker_call_timeout_s`` surfaces on the driver as a ``WorkerGroupError`` naming the worker,
the call and the training step. With ``trainer.max_restarts=N`` the supervisor then stops the whole
worker group (hung ranks included), builds a fresh trainer and worker group, and resumes from the
last complete checkpoint — the same thing a rerun of the command does with ``resume_mode=auto``, so
the final weights equal an uninterrupted run's. Past N restarts (or with N=0) the error propagates
and the command exits non-zero.

Only worker failures restart: a configuration error, a reward scorer that always fails, a diverged
update (:class:`hybrid_rl.trainer.core.health.TrainingHealthError`) or a full disk would fail again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from hybrid_rl.single_controller import WorkerGroupError

logger = logging.getLogger(__name__)


def _restart_config(config: Any, trainer: Any) -> Any:
    """The config of the next attempt: resume from the newest checkpoint the failed attempt committed;
    if it committed none, start the way the failed attempt did (its resume settings)."""
    if trainer.last_committed_step is None:
        return config
    step_dir = trainer.checkpoints.step_dir(trainer.last_committed_step)
    resume = dataclasses.replace(config.trainer, resume_mode="resume_path", resume_from_path=step_dir)
    return dataclasses.replace(config, trainer=resume)


def run_supervised(trainer: Any, rebuild: Callable[[Any], Any]) -> dict[str, float]:
    """``trainer.init_workers(); trainer.fit()``, with up to ``trainer.max_restarts`` restarts.

    Args:
        trainer: a built (not started) trainer of any mode (a
            :class:`~hybrid_rl.trainer.core.loop.TrainerCore`).
        rebuild: makes the trainer of the next attempt from its config (e.g. ``build_trainer``).

    Returns the last step's metrics; the workers of every attempt are stopped on the way out.
    """
    max_restarts = trainer.config.trainer.max_restarts
    if max_restarts < 0:
        raise ValueError(f"trainer.max_restarts={max_restarts} must be >= 0 (0 = no automatic restart)")
    for attempt in range(max_restarts + 1):
        try:
            trainer.init_workers()
            return trainer.fit()
        except WorkerGroupError as error:
            if attempt == max_restarts:
                if max_restarts > 0:
                    logger.error("worker failure after %d restart(s) (trainer.max_restarts=%d): giving up",
                                 attempt, max_restarts)
                raise
            config = _restart_config(trainer.config, trainer)
            logger.warning("restart %d/%d after a worker failure: %s\n-> stopping the workers and resuming from %s",
                           attempt + 1, max_restarts, str(error).splitlines()[0],
                           config.trainer.resume_from_path or f"resume_mode={config.trainer.resume_mode}")
        finally:
            trainer.shutdown()  # every attempt's workers, hung ones included
        trainer = rebuild(config)
    raise AssertionError("unreachable: the loop returns or raises")
