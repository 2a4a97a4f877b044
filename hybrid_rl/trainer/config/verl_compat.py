"""Notices for veRL command lines whose meaning changes under hybrid_rl's defaults.

Every key of veRL's documented GSM8K quickstart and example scripts is accepted with veRL's value
shapes (``tests/trainer/test_verl_cli.py``; the mapping is in ``docs/verl_compat.md``). What such a
command line does *not* set comes from hybrid_rl's defaults, which are tuned for the no-argument demo
run (GRPO, 8 samples per prompt, 4 steps). Where that silently changes what a veRL user asked for,
the run says so in one line, with the override that restores veRL's behaviour.
"""

from __future__ import annotations

from typing import Any

from hybrid_rl.trainer.config.checks import estimator_needs, estimators_where, loss_needs
from hybrid_rl.trainer.config.schema import PPOConfig, key_owner

__all__ = ["recommended_setting_notices", "verl_default_notices"]


def _keys(overrides: list[str]) -> set[str]:
    """The config keys a list of Hydra overrides sets."""
    return {o.lstrip("+~").split("=", 1)[0] for o in overrides}


def verl_default_notices(cfg: PPOConfig, overrides: list[str]) -> list[str]:
    """One line per veRL default that differs from ours and that the command line relies on."""
    keys = _keys(overrides)
    notices = []
    needs = estimator_needs(cfg)
    if any(k.startswith("critic.") for k in keys) and "algorithm.adv_estimator" not in keys \
            and not needs.needs_critic:
        notices.append(f"critic.* is set but algorithm.adv_estimator={cfg.algorithm.adv_estimator} (hybrid_rl's "
                       "default; veRL's trains a critic) trains no critic: add algorithm.adv_estimator="
                       f"{estimators_where(lambda i: i.needs_critic)} to run PPO as veRL does.")
    if needs.needs_critic and "actor_rollout_ref.rollout.n" not in keys \
            and cfg.actor_rollout_ref.rollout.n != 1:
        notices.append(f"actor_rollout_ref.rollout.n={cfg.actor_rollout_ref.rollout.n} is hybrid_rl's default "
                       "(veRL's is 1): add actor_rollout_ref.rollout.n=1 for one response per prompt as in veRL.")
    micro = sorted(k for k in keys if k.endswith(("micro_batch_size_per_gpu", ".ppo_micro_batch_size")))
    if micro and "actor_rollout_ref.actor.use_dynamic_bsz" not in keys and cfg.actor_rollout_ref.actor.use_dynamic_bsz:
        notices.append(f"{micro[0]} is not used: hybrid_rl packs micro-batches by tokens by default "
                       "(use_dynamic_bsz=true; veRL's default is false): add "
                       "actor_rollout_ref.actor.use_dynamic_bsz=false (and critic.use_dynamic_bsz=false) for "
                       "veRL's row-count micro-batches.")
    steps = cfg.trainer.total_training_steps
    if "trainer.total_epochs" in keys and "trainer.total_training_steps" not in keys and steps is not None:
        notices.append(f"trainer.total_training_steps={steps} (hybrid_rl's demo default) ends this run before "
                       f"trainer.total_epochs={cfg.trainer.total_epochs}: add trainer.total_training_steps=null to "
                       "train every epoch as veRL does.")
    return notices


def _value(cfg: PPOConfig, key: str) -> Any:
    owner, leaf = key_owner(cfg, key)
    return getattr(owner, leaf)


def recommended_setting_notices(cfg: PPOConfig, overrides: list[str]) -> list[str]:
    """One line per value the chosen policy loss is meant to run with (its registry info's
    ``recommended``) that the run neither sets nor has."""
    keys, info = _keys(overrides), loss_needs(cfg)
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    return [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} is usually run with {key}={value} "
            f"(this run has {'null' if _value(cfg, key) is None else _value(cfg, key)}); add {key}={value} to follow it."
            for key, value in info.recommended.items() if key not in keys and _value(cfg, key) != value]
