"""Run-level health checks: stop a run that can no longer learn, with an error that says why.

Two failures are survivable for a step or two but mean a broken run when they persist:

* every sample's reward failed (the scorer raised, timed out or returned a non-number): the reward
  manager scores those samples 0 and sets ``reward/all_failed``; K such steps in a row mean the scorer
  is broken, not the model (``trainer.max_consecutive_reward_failures``);
* an update skipped an optimizer step because the loss or gradient norm was not finite (the workers
  count it in ``actor/num_skipped_steps`` / ``critic/num_skipped_steps``); K such steps in a row mean
  the run diverged (``trainer.max_consecutive_skipped_updates``).

The streaks are part of the driver state in each checkpoint, so a resumed run counts on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional

logger = logging.getLogger(__name__)

SKIP_METRICS = ("actor/num_skipped_steps", "critic/num_skipped_steps")


class TrainingHealthError(RuntimeError):
    """The run stopped because a failure persisted for K consecutive steps (see the message)."""


def _check_limit(key: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise ValueError(f"trainer.{key}={value} must be >= 1 or null (never stop); "
                         f"e.g. trainer.{key}=3")


@dataclass
class HealthMonitor:
    """Counts consecutive all-failed reward steps and skipped updates; raises past the limits."""

    max_consecutive_reward_failures: Optional[int] = 3
    """Limit of the reward-failure streak (None = no limit)."""
    max_consecutive_skipped_updates: Optional[int] = 3
    """Limit of the skipped-update streak (None = no limit)."""
    reward_failure_streak: int = 0
    """Consecutive steps so far in which every reward failed."""
    skipped_update_streak: int = 0
    """Consecutive steps so far with a skipped optimizer step."""

    def __post_init__(self) -> None:
        _check_limit("max_consecutive_reward_failures", self.max_consecutive_reward_failures)
        _check_limit("max_consecutive_skipped_updates", self.max_consecutive_skipped_updates)

    @classmethod
    def from_config(cls, trainer_cfg: Any) -> "HealthMonitor":
        # a mode without rewards (SFT, RM) has no reward-failure limit
        return cls(getattr(trainer_cfg, "max_consecutive_reward_failures", None),
                   trainer_cfg.max_consecutive_skipped_updates)

    def observe(self, metrics: Mapping[str, float], step: int) -> None:
        """Update the streaks with one step's metrics; TrainingHealthError when a limit is reached."""
        failed = metrics.get("reward/all_failed", 0.0) > 0
        self.reward_failure_streak = self.reward_failure_streak + 1 if failed else 0
        skipped = any(metrics.get(key, 0.0) > 0 for key in SKIP_METRICS)
        self.skipped_update_streak = self.skipped_update_streak + 1 if skipped else 0
        if failed:
            logger.warning("step %d: every reward failed (%d in a row); see the first failure logged by "
                           "the reward manager", step, self.reward_failure_streak)
        if skipped:
            logger.warning("step %d: update skipped for a non-finite loss/grad norm (%d in a row)",
                           step, self.skipped_update_streak)
        self._raise_past_limits(metrics, step)

    def _raise_past_limits(self, metrics: Mapping[str, float], step: int) -> None:
        limit = self.max_consecutive_reward_failures
        if limit is not None and self.reward_failure_streak >= limit:
            raise TrainingHealthError(
                f"step {step}: the reward of every sample failed for {self.reward_failure_streak} consecutive "
                f"steps (trainer.max_consecutive_reward_failures={limit}; last step: "
                f"{metrics.get('reward/num_errors', 0):.0f} errors, {metrics.get('reward/num_timeouts', 0):.0f} "
                f"timeouts, {metrics.get('reward/num_invalid', 0):.0f} non-numeric results). The scorer is broken, "
                "not the model: fix the reward function (the first failure and its input are in the log "
                "above) or raise reward_model.timeout if it is only slow.")
        limit = self.max_consecutive_skipped_updates
        if limit is not None and self.skipped_update_streak >= limit:
            norm = metrics.get("actor/grad_norm", float("nan"))
            raise TrainingHealthError(
                f"step {step}: the update was skipped for a non-finite loss or gradient norm (actor/grad_norm="
                f"{norm}) in {self.skipped_update_streak} consecutive steps "
                f"(trainer.max_consecutive_skipped_updates={limit}). The run diverged: lower "
                "actor_rollout_ref.actor.optim.lr (or critic.optim.lr), set a grad_clip, check the data and "
                "rewards for inf/NaN, or use float32 (fsdp_config.mixed_precision.param_dtype=float32); "
                "then resume from the last checkpoint.")

    def state_dict(self) -> dict[str, int]:
        """The streaks (saved in the driver state of each checkpoint)."""
        return {"reward_failure_streak": self.reward_failure_streak,
                "skipped_update_streak": self.skipped_update_streak}

    def load_state_dict(self, state: Optional[Mapping[str, int]]) -> None:
        state = state or {}
        self.reward_failure_streak = int(state.get("reward_failure_streak", 0))
        self.skipped_update_streak = int(state.get("skipped_update_streak", 0))
