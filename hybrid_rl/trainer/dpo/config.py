"""The typed config of ``main_dpo`` (:class:`DPOConfig`) and the actor worker's config built from it.

Keys: veRL's SFT trainer names (``data.*``, ``model.partial_pretrain``, ``optim.*``, ``trainer.*``) as
``main_sft`` and ``main_rm`` take them, the preference columns as ``main_rm`` names them
(``data.chosen_key`` / ``rejected_key``) and, in ``dpo.*``, the settings of the ``dpo`` objective under
TRL's ``DPOConfig`` names (``beta``, ``loss_type``, ``label_smoothing``, ``simpo_gamma``,
``reference_free``); the objective's own ``Config`` checks them
(:class:`hybrid_rl.objectives.preference.DPOConfig`). Batch sizes count PAIRS: a batch of B pairs is
2B policy rows (row 2i a pair's chosen, 2i+1 its rejected response), so the actor's row sizes are
twice the pair sizes (:func:`dpo_actor_config`).

The schema is registered with Hydra from here (``dpo_trainer_schema``, and ``dpo_trainer``, the
primary config that lists it, as ``sft_trainer.yaml`` does for SFT): no YAML file is needed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from hybrid_rl.objectives import build_objective
from hybrid_rl.trainer.config.loader import ConfigSchema
from hybrid_rl.trainer.config.schema import BaseTrainerConfig, CustomRewardFunctionConfig, RayInitConfig
from hybrid_rl.trainer.config.supervised import (SFTModelConfig, SupervisedDataConfig, SupervisedOptimConfig,
                                                 supervised_rollout, supervised_trainer)
from hybrid_rl.utils.bounds import bounded
from hybrid_rl.workers.config import ActorConfig, ActorRolloutRefConfig, ModelConfig, RefConfig
from hybrid_rl.workers.rollout.config import RolloutConfig

__all__ = ["DPOConfig", "DPODataConfig", "DPOObjectiveConfig", "DPO_OBJECTIVE", "DPO_SCHEMA", "dpo_actor_config",
           "dpo_objective", "objective_settings"]

DPO_OBJECTIVE = "dpo"
"""The objective a DPO run's actor trains (``hybrid_rl.objectives.preference``)."""
_OBJECTIVE_KEY = "actor_rollout_ref.actor.objective"
"""How the objective's own checks name their section; a DPO run names it ``dpo``."""


@dataclass
class DPODataConfig(SupervisedDataConfig):
    """Preference pairs for the policy (the reward model's loaders and shapes,
    :mod:`hybrid_rl.data.preference`), their batching, and the prompts of the held-out generations."""

    train_batch_size: int = bounded(16, ge=1, fix="use a positive multiple of the worker count")
    """Pairs per optimizer step (2 rows each: chosen and rejected), split over the workers."""
    micro_batch_size_per_gpu: int = bounded(4, ge=1, fix="use e.g. 4 pairs")
    """Pairs per forward/backward on one worker when ``use_dynamic_bsz`` is false (TRL's
    ``per_device_train_batch_size``); the two rows of a pair are always in one micro-batch."""
    val_batch_size: Optional[int] = bounded(None, ge=1, fix="use null (all at once) or e.g. 64")
    """Held-out pairs (and prompts) per call; null = all at once."""
    chosen_key: str = "chosen"
    """Column of the preferred response (TRL's and OpenRLHF's ``chosen``)."""
    rejected_key: str = "rejected"
    """Column of the dispreferred response (TRL's and OpenRLHF's ``rejected``)."""
    max_prompt_length: int = bounded(128, ge=1, fix="use e.g. 128 tokens")
    """Most prompt tokens after the chat template (TRL's ``max_prompt_length``): a longer pair's prompt
    follows ``truncation``; a longer held-out prompt is not generated for."""
    max_length: int = bounded(1024, ge=2, fix="use e.g. 1024 tokens")
    """Most tokens of prompt + one response (TRL's ``max_length``); longer responses follow ``truncation``."""
    truncation: str = "error"
    """An overlong pair: error (refused, a bad row) | left (keep the prompt's end) | right (keep its
    start); a response over ``max_length`` always keeps its start."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches of whole pairs by ``max_token_len_per_gpu`` tokens instead of
    ``micro_batch_size_per_gpu`` pairs."""
    max_token_len_per_gpu: int = bounded(4096, ge=2, fix="use at least twice data.max_length")
    """Token budget of one forward/backward when ``use_dynamic_bsz`` is true (>= 2 x ``max_length``:
    a pair's two rows go together)."""
    max_response_length: int = bounded(16, ge=1, fix="use e.g. 256 tokens")
    """Held-out generations: most tokens of an answer."""
    reward_fn_key: str = "data_source"
    """Held-out generations: the column that picks the scorer (rule rewards are registered by it)."""


@dataclass
class DPOObjectiveConfig:
    """The ``dpo`` objective's settings, TRL's ``DPOConfig`` names and defaults (checked by the
    objective's own config, :class:`hybrid_rl.objectives.preference.DPOConfig`)."""

    beta: float = 0.1
    """Inverse temperature of the implicit reward ``beta * (log pi - log pi_ref)`` (IPO's tau, SimPO's beta); > 0."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO) | robust (label-noise robust DPO) | hinge (SLiC) | ipo | simpo (reference-free, length-normalised)."""
    label_smoothing: float = 0.0
    """Probability that a pair's label is flipped, in [0, 0.5) (cDPO / robust); sigmoid, robust and simpo only."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin (loss_type=simpo only); >= 0."""
    reference_free: bool = False
    """Ignore the reference policy (an implicit uniform reference): no reference model is built or run."""


@dataclass
class DPOConfig:
    """An offline DPO run on preference pairs (``python -m hybrid_rl.trainer.main_dpo``)."""

    data: DPODataConfig = field(default_factory=DPODataConfig)
    """Preference pairs, their batching and the held-out prompts."""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """The policy trained (usually the SFT model); the reference is a frozen copy of its start (with
    LoRA: the base with the adapters disabled, no copy)."""
    optim: SupervisedOptimConfig = field(default_factory=SupervisedOptimConfig)
    """Its optimizer."""
    dpo: DPOObjectiveConfig = field(default_factory=DPOObjectiveConfig)
    """The DPO loss (TRL's names)."""
    rollout: RolloutConfig = field(default_factory=supervised_rollout)
    """The engine of the held-out generations (``val_kwargs``: greedy by default); ``n`` stays 1."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A scoring function for the held-out generations (null = the built-in scorers by data source)."""
    trainer: BaseTrainerConfig = field(default_factory=supervised_trainer("dpo"))
    """Run length, devices, logging, validation and checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """ray.init arguments."""


DPO_SCHEMA = ConfigSchema("dpo_trainer", DPOConfig, "main_dpo")
"""``main_dpo``'s config: the dataclass, registered with Hydra below (no YAML file)."""
ConfigStore.instance().store(name=DPO_SCHEMA.schema_name, node=OmegaConf.structured(DPOConfig))
ConfigStore.instance().store(name=DPO_SCHEMA.config_name,
                             node={"defaults": [DPO_SCHEMA.schema_name, "_self_"]})


def objective_settings(cfg: DPOConfig) -> dict[str, Any]:
    """The ``dpo`` section as the objective's settings."""
    return {f.name: getattr(cfg.dpo, f.name) for f in dataclasses.fields(DPOObjectiveConfig)}


def dpo_objective(cfg: DPOConfig) -> Any:
    """The ``dpo`` objective of ``cfg.dpo``; its checks' one-line ValueError names the ``dpo.*`` key."""
    try:
        return build_objective(DPO_OBJECTIVE, objective_settings(cfg), key="dpo")
    except ValueError as error:
        raise ValueError(str(error).replace(f"{_OBJECTIVE_KEY}.", "dpo.")) from None


def dpo_actor_config(cfg: DPOConfig) -> ActorRolloutRefConfig:
    """The actor worker's config of a DPO run: the ``dpo`` objective of ``cfg.dpo``, one optimizer
    step per ``data.train_batch_size`` pairs (2 rows each), one pass over each batch in order, the
    reference's log-prob passes batched as the actor's."""
    d, rows = cfg.data, 2  # rows per pair
    objective = {"name": DPO_OBJECTIVE, **objective_settings(cfg)}
    actor = ActorConfig(ppo_mini_batch_size=rows * d.train_batch_size,
                        ppo_micro_batch_size_per_gpu=rows * d.micro_batch_size_per_gpu,
                        use_dynamic_bsz=d.use_dynamic_bsz, ppo_max_token_len_per_gpu=d.max_token_len_per_gpu,
                        objective=objective, ppo_epochs=1, shuffle=False, grad_clip=cfg.optim.clip_grad,
                        optim=cfg.optim.as_optim(), fsdp_config=cfg.model.fsdp_config)
    ref = RefConfig(log_prob_micro_batch_size_per_gpu=rows * d.micro_batch_size_per_gpu,
                    log_prob_use_dynamic_bsz=d.use_dynamic_bsz, log_prob_max_token_len_per_gpu=d.max_token_len_per_gpu,
                    fsdp_config=cfg.model.fsdp_config)
    return ActorRolloutRefConfig(model=ModelConfig(**cfg.model.model_fields()), actor=actor, ref=ref,
                                 rollout=replace(cfg.rollout, n=1))
