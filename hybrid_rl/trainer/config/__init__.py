"""The trainer's configuration: the typed schemas (every key, default and docstring: PPO's
:mod:`.schema`, SFT's and reward-model training's :mod:`.supervised`), their Hydra composition
(:mod:`.loader`, over ``ppo_trainer.yaml`` / ``sft_trainer.yaml`` / ``rm_trainer.yaml``, which hold
Hydra's settings only), the checks every mode shares (:mod:`.run_checks`), PPO's checks and run plan
(:mod:`.checks`), the supervised modes' (:mod:`.supervised_checks`), the ``--help`` text
(:mod:`.docs`) and the veRL notices (:mod:`.verl_compat`). The schemas' classes are importable from here."""

from hybrid_rl.trainer.config.schema import (
    ArithmeticDataConfig,
    DataConfig,
    KLCtrlConfig,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    RewardModelModelConfig,
    RewardModelConfig,
    RayInitConfig,
    BaseTrainerConfig,
    TrainerConfig,
    RolloutPoolConfig,
    AsyncTrainingConfig,
    PPOConfig,
    LINKED_DEFAULTS,
)
from hybrid_rl.trainer.config.supervised import (
    MultiturnDataConfig,
    SFTConfig,
    RMConfig,
)

__all__ = [
    "ArithmeticDataConfig",
    "DataConfig",
    "KLCtrlConfig",
    "AlgorithmConfig",
    "CustomRewardFunctionConfig",
    "RewardModelModelConfig",
    "RewardModelConfig",
    "RayInitConfig",
    "BaseTrainerConfig",
    "TrainerConfig",
    "RolloutPoolConfig",
    "AsyncTrainingConfig",
    "PPOConfig",
    "LINKED_DEFAULTS",
    "SFTConfig",
    "RMConfig",
]
