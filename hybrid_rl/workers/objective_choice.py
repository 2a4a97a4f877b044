"""The actor's objective, chosen in the config (``actor_rollout_ref.actor.objective``).

An empty section (the default) trains PPO's terms from veRL's keys
(:func:`hybrid_rl.objectives.ppo.ppo_objective`: ``policy_loss.*``, ``entropy_coeff``,
``use_kl_loss``/``kl_loss_*`` and ``distillation.*``). ``{name: <registered objective>, <its
settings>}`` trains that objective instead (``{name: nll}``, ``{name: dpo, beta: 0.1}``); an
objective with a ``loss_agg_mode`` setting that is not given takes ``actor.loss_agg_mode``.
:class:`~hybrid_rl.workers.config.ActorConfig` checks the section when it is built, so a wrong
name, setting or value fails at config time in one line naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from hybrid_rl.objectives import Objective, build_objective, get_objective_cls, registered_objectives
from hybrid_rl.objectives.ppo import ppo_objective

__all__ = ["OBJECTIVE_KEY", "actor_objective", "objective_settings", "selected_objective"]

OBJECTIVE_KEY = "actor_rollout_ref.actor.objective"
"""The config key of the section (named in its errors)."""


def objective_settings(actor: Any) -> Optional[tuple[str, dict[str, Any]]]:
    """``(name, settings)`` of the objective the actor section selects, ``loss_agg_mode`` filled from
    ``actor.loss_agg_mode`` where the objective has that setting; None when the section is empty
    (PPO's terms). ValueError naming the key for a section without a name or an unknown name."""
    section = dict(actor.objective or {})
    if not section:
        return None
    name = section.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{OBJECTIVE_KEY}.name is missing (the section holds {sorted(section)}). Fix: set "
                         f"{OBJECTIVE_KEY}.name to one of {registered_objectives()}, or leave {OBJECTIVE_KEY} "
                         "empty to train PPO's terms.")
    config_cls = getattr(get_objective_cls(name), "Config", None)  # an unknown name fails here, naming the valid
    fields = {f.name for f in dataclasses.fields(config_cls)} if config_cls is not None else set()
    if "loss_agg_mode" in fields and "loss_agg_mode" not in section:
        section["loss_agg_mode"] = actor.loss_agg_mode
    return name, section


def selected_objective(actor: Any) -> Optional[Objective]:
    """The objective ``actor.objective`` selects, built from its settings; None when it is empty."""
    chosen = objective_settings(actor)
    return None if chosen is None else build_objective(*chosen, key=OBJECTIVE_KEY)


def actor_objective(actor: Any, distillation: Any = None) -> Objective:
    """What the actor trains: the objective ``actor.objective`` selects, else PPO's terms from
    veRL's keys (+ the distillation term when ``distillation`` is given: a
    ``DistillationLossConfig`` of an enabled ``distillation`` section)."""
    selected = selected_objective(actor)
    if selected is None:
        return ppo_objective(actor, distillation)
    if distillation is not None:
        raise ValueError(f"{OBJECTIVE_KEY}.name={selected.name} replaces PPO's loss, so distillation.enabled=true "
                         f"has no loss term to join. Fix: set distillation.enabled=false, or leave {OBJECTIVE_KEY} "
                         "empty to train PPO's terms with distillation.")
    return selected
