"""Config checks of ``actor_rollout_ref.rollout.agent.rows=every_call`` (several rows per rollout).

Under ``every_call`` a rollout of a black-box agent gives a varying number of rows, so the parts of a
run that assume ``rollout.n`` rows per prompt in fixed strides, or an advantage that varies along a
response, are refused here, each in one line naming both keys and the fix (docs/agents.md, "Several
rows per rollout").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybrid_rl.trainer.config.schema import PPOConfig

__all__ = ["check_agent_rows"]

_KEY = "actor_rollout_ref.rollout.agent.rows=every_call"


def check_agent_rows(cfg: "PPOConfig") -> list[str]:
    """One line per setting that cannot run with several rows per rollout; [] under ``rows: chain``."""
    from hybrid_rl.algorithms import adv_estimator_info, registered_adv_estimators
    from hybrid_rl.trainer.config.paired_checks import paired_objective

    if cfg.actor_rollout_ref.rollout.agent.rows != "every_call":
        return []
    errors = []
    name = cfg.algorithm.adv_estimator
    if name in registered_adv_estimators():  # an unknown name is reported by the estimator check
        info = adv_estimator_info(name)
        if info.per_token or info.needs_critic or info.needs_greedy_baseline:
            errors.append(f"{_KEY} shares one rollout's advantage among its rows, but algorithm.adv_estimator={name} "
                          "gives advantages that vary along a response (or a per-row baseline). Fix: use an outcome "
                          "estimator such as grpo or rloo, or agent.rows=chain.")
    if cfg.async_training.enable:
        errors.append(f"{_KEY} is wired for the synchronous (batch) rollout only, but async_training.enable=true "
                      "(the decoupled / streaming / partial-rollout path). Fix: set async_training.enable=false, "
                      "or agent.rows=chain.")
    if cfg.algorithm.filter_groups.enable:
        errors.append(f"{_KEY} gives a prompt group a varying number of rows, but algorithm.filter_groups.enable=true "
                      "selects groups of rollout.n rows. Fix: set algorithm.filter_groups.enable=false, or "
                      "agent.rows=chain.")
    actor = cfg.actor_rollout_ref.actor
    if paired_objective(cfg) is not None:
        name = actor.objective.get("name")
        errors.append(f"{_KEY} gives a prompt group a varying number of rows, but actor_rollout_ref.actor.objective."
                      f"name={name} trains best-vs-worst pairs of rollouts. Fix: use PPO's objective, or "
                      "agent.rows=chain.")
    if actor.ppo_mini_batch_size != cfg.data.train_batch_size:
        errors.append(f"{_KEY} makes the step's rows one mini-batch (their number varies), but "
                      f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} != "
                      f"data.train_batch_size={cfg.data.train_batch_size}. Fix: set them equal "
                      "(ppo_epochs repeats the update), or agent.rows=chain.")
    return errors
