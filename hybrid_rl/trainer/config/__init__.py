"""The trainer's configuration: the typed schema (every key, default and docstring: :mod:`.schema`),
its Hydra composition (:mod:`.loader`, over ``ppo_trainer.yaml``, which holds Hydra's settings only),
the checks and derived run plan (:mod:`.checks`), the ``--help`` text (:mod:`.docs`) and the veRL
notices (:mod:`.verl_compat`). The schema's classes are importable from here."""

from hybrid_rl.trainer.config.schema import (
    ArithmeticDataConfig,
    MultiturnDataConfig,
    DataConfig,
    KLCtrlConfig,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    RewardModelModelConfig,
    RewardModelConfig,
    RayInitConfig,
    TrainerConfig,
    RolloutPoolConfig,
    AsyncTrainingConfig,
    PPOConfig,
    LINKED_DEFAULTS,
)

__all__ = [
    "ArithmeticDataConfig",
    "MultiturnDataConfig",
    "DataConfig",
    "KLCtrlConfig",
    "AlgorithmConfig",
    "CustomRewardFunctionConfig",
    "RewardModelModelConfig",
    "RewardModelConfig",
    "RayInitConfig",
    "TrainerConfig",
    "RolloutPoolConfig",
    "AsyncTrainingConfig",
    "PPOConfig",
    "LINKED_DEFAULTS",
]
