"""Start-up checks of online DPO: a paired actor objective in the PPO loop (config only).

``actor_rollout_ref.actor.objective`` may select an objective the registry marks ``paired`` (its rows
come in chosen/rejected pairs, e.g. ``{name: dpo, beta: 0.1}``). The PPO trainer then builds the pairs
from each prompt's rollout group and trains the objective on them
(:mod:`hybrid_rl.trainer.ppo.paired`). What that needs and what it makes unused:

* ``actor_rollout_ref.rollout.n >= 2`` (a pair needs two responses to the same prompt);
* no critic: an ``algorithm.adv_estimator`` that trains one (``gae``) is refused, as are the settings
  that only shape advantages or PPO's ratio (``algorithm.use_kl_in_reward``,
  ``actor.use_kl_loss``, a measured ``algorithm.rollout_correction``);
* the colocated loop only (``async_training.enable=false``: the decoupled mode is not wired for pairs);
* any other ``algorithm.adv_estimator`` is not used (the default ``grpo`` says nothing): as in TRL's
  online DPO, the responses are ranked by their reward alone. A non-default one gets a notice
  (:func:`paired_notices`), not an error, so a GRPO command line switches to online DPO by adding
  the objective only.
"""

from __future__ import annotations

from typing import Any, Optional

from hybrid_rl.objectives import Objective
from hybrid_rl.objectives.registry import objective_info
from hybrid_rl.workers.objective_choice import OBJECTIVE_KEY, objective_settings, selected_objective

__all__ = ["DEFAULT_ESTIMATOR", "check_paired_objective", "objective_needs_reference", "paired_notices",
           "paired_objective"]

DEFAULT_ESTIMATOR = "grpo"
"""``algorithm.adv_estimator``'s default: a paired objective leaves it unused without a notice."""


def paired_objective(cfg: Any) -> Optional[Objective]:
    """The objective ``actor_rollout_ref.actor.objective`` selects when its registry info says its
    rows come in (chosen, rejected) pairs; None otherwise (PPO's terms, ``nll``, ...)."""
    chosen = objective_settings(cfg.actor_rollout_ref.actor)
    if chosen is None or not objective_info(chosen[0]).paired:
        return None
    return selected_objective(cfg.actor_rollout_ref.actor)


def objective_needs_reference(objective: Objective) -> bool:
    """Whether this configured objective reads ``ref_log_prob`` (its ``needs_reference`` property,
    else its registry info's)."""
    return bool(getattr(objective, "needs_reference", objective_info(objective.name).needs_reference))


def check_paired_objective(cfg: Any) -> list[str]:
    """One line per setting that a paired actor objective cannot run with (none for other objectives)."""
    from hybrid_rl.algorithms import adv_estimator_info, registered_adv_estimators
    from hybrid_rl.algorithms.rollout_correction import resolve_preset

    objective = paired_objective(cfg)
    if objective is None:
        return []
    what = f"{OBJECTIVE_KEY}.name={objective.name} (pairs of each prompt's responses)"
    alg, arr, errors = cfg.algorithm, cfg.actor_rollout_ref, []
    if arr.rollout.n < 2:
        errors.append(f"{what} needs two or more responses per prompt, but actor_rollout_ref.rollout.n="
                      f"{arr.rollout.n}. Fix: set actor_rollout_ref.rollout.n >= 2 (e.g. 8).")
    name = alg.adv_estimator
    if name in registered_adv_estimators() and adv_estimator_info(name).needs_critic:
        errors.append(f"{what} trains no critic and reads no advantage, but algorithm.adv_estimator={name} needs a "
                      f"critic. Fix: set algorithm.adv_estimator={DEFAULT_ESTIMATOR} (unused by {objective.name}).")
    if alg.use_kl_in_reward:
        errors.append(f"{what} reads no reward-derived advantage, so algorithm.use_kl_in_reward=true has no effect. "
                      f"Fix: set algorithm.use_kl_in_reward=false ({objective.name}'s beta sets its pull to the "
                      "reference).")
    if arr.actor.use_kl_loss:
        errors.append(f"{what} replaces PPO's loss terms, so actor_rollout_ref.actor.use_kl_loss=true has no term "
                      f"to add to. Fix: set actor_rollout_ref.actor.use_kl_loss=false ({objective.name}'s beta sets "
                      "its pull to the reference).")
    try:
        measured = resolve_preset(alg.rollout_correction).measured
    except ValueError:
        measured = False  # reported by the rollout-correction check
    if cfg.async_training.enable:
        errors.append(f"{what} runs in the colocated loop only; async_training.enable=true is not supported with it. "
                      "Fix: set async_training.enable=false.")
    if measured:
        errors.append(f"{what} has no old log-probs or importance ratio to correct, so algorithm.rollout_correction "
                      "does not apply. Fix: leave algorithm.rollout_correction at its defaults.")
    return errors


def paired_notices(cfg: Any) -> list[str]:
    """Settings a paired actor objective leaves unused (logged at start-up, not errors)."""
    objective = paired_objective(cfg)
    name = cfg.algorithm.adv_estimator
    if objective is None or name == DEFAULT_ESTIMATOR:
        return []
    return [f"algorithm.adv_estimator={name} is not used: {OBJECTIVE_KEY}.name={objective.name} trains on the "
            "best vs worst response of each prompt group, ranked by reward (no advantage is computed)"]
