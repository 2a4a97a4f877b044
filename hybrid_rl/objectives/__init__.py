"""Objectives: the losses a learner minimises, as objects that own their config, declare the batch
keys they read and write, and return ``(loss, metrics)`` (:mod:`~hybrid_rl.objectives.base`);
registered by name (:mod:`~hybrid_rl.objectives.registry`). Below the workers, above ``algorithms``:
an objective knows tensors and its config, never a worker or the trainer.
"""

from hybrid_rl.objectives.base import ForwardNeeds, MicroBatch, Objective, WeightedSum, missing_keys
from hybrid_rl.objectives.registry import (ObjectiveInfo, build_objective, describe_objectives, get_objective_cls,
                                           objective_info, register_objective, registered_objectives,
                                           unregister_objective)

__all__ = ["ForwardNeeds", "MicroBatch", "Objective", "ObjectiveInfo", "WeightedSum", "build_objective",
           "describe_objectives", "get_objective_cls", "missing_keys", "objective_info", "register_objective",
           "registered_objectives", "unregister_objective"]

from hybrid_rl.objectives import distillation, ppo, preference, supervised, value  # noqa: E402,F401  (register the built-in objectives)
