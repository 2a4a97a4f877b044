"""Typed configs of the supervised modes: :class:`SFTConfig` (``main_sft``) and :class:`RMConfig`
(``main_rm``), with veRL's SFT trainer names (``data.*``, ``model.partial_pretrain``, ``optim.*``,
``trainer.*``).

They are their own Hydra schemas (``sft_trainer_schema``, ``rm_trainer_schema``), so each command line
lists, checks and records only its own keys; nothing of PPO's (no estimator, no ``rollout.n``, no KL)
appears in them. Each mode builds the typed config of the worker it runs from its own sections
(:func:`sft_actor_config`, :func:`rm_critic_config`): what the worker needs of a supervised run
(the ``nll`` objective, one optimizer step per batch, no reference policy) is set there, in code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from hybrid_rl.utils.bounds import bounded

from hybrid_rl.trainer.config.schema import (ArithmeticDataConfig, BaseTrainerConfig, CustomRewardFunctionConfig,
                                             RayInitConfig, linked_group)
from hybrid_rl.workers.config import (DEFAULT_MODEL_PATH, ActorConfig, ActorRolloutRefConfig, CriticConfig,
                                      CriticModelConfig, FSDPConfig, ModelConfig, OptimConfig)
from hybrid_rl.workers.rollout.config import RolloutConfig

__all__ = ["MultiturnDataConfig", "RMConfig", "RMDataConfig", "SFTConfig", "SFTDataConfig", "SFTModelConfig", "SFT_LINKED_DEFAULTS",
           "SFT_OBJECTIVE", "SupervisedModelConfig", "SupervisedOptimConfig", "rm_critic_config", "sft_actor_config"]


@dataclass
class MultiturnDataConfig:
    """SFT on whole conversations (veRL's SFT ``data.multiturn.*``)."""

    enable: bool = False
    """true: each row is a conversation in ``messages_key``; every assistant turn is trained on."""
    messages_key: str = "messages"
    """Column holding the conversation (chat messages)."""


@dataclass
class SupervisedDataConfig:
    """The training and held-out files and their batching (veRL's SFT ``data.*``)."""

    train_files: Any = None
    """Data file(s): ``.parquet``, ``.jsonl``, ``.json``, ``.jsonl.gz``, ``.json.gz``, folders or globs of
    them; null = the arithmetic task's examples, generated on first
    use into ``data.arithmetic.cache_dir``."""
    val_files: Any = None
    """Held-out file(s); null = the arithmetic task's held-out split when train_files is null, else none."""
    prompt_key: str = "prompt"
    """Column holding the prompt (chat messages or a string)."""
    train_batch_size: int = bounded(16, ge=1, fix="use a positive multiple of the worker count")
    """Rows per optimizer step (split over the workers)."""
    micro_batch_size_per_gpu: int = bounded(4, ge=1, fix="use e.g. 4 rows")
    """Rows per forward/backward on one worker (gradients are accumulated over the batch)."""
    val_batch_size: Optional[int] = bounded(None, ge=1, fix="use null (all at once) or e.g. 64")
    """Held-out rows per call; null = all at once."""
    max_length: int = bounded(1024, ge=2, fix="use e.g. 1024 tokens")
    """Most tokens of one rendered conversation (prompt + response); longer ones follow ``truncation``."""
    truncation: str = "error"
    """An overlong conversation: error | left (keep the end) | right (keep the start)."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (seeded by ``data.seed``)."""
    seed: int = 1
    """Seed of the training sampler's shuffle."""
    bad_rows: str = "error"
    """A malformed row: error (stop, naming the file, row and reason) | skip (leave it out, count the
    reasons, report them in one line)."""
    max_bad_fraction: float = bounded(0.01, ge=0, lt=1, fix="use a fraction such as 0.01")
    """With ``bad_rows=skip``: refuse to start when more than this fraction of the rows is bad."""
    arithmetic: ArithmeticDataConfig = field(default_factory=ArithmeticDataConfig)
    """The built-in task's settings (only used when ``train_files`` is null)."""


@dataclass
class SFTDataConfig(SupervisedDataConfig):
    """SFT's data: conversations, their target turns, and the prompts of the held-out generations."""

    response_key: str = "response"
    """Column holding the target response text."""
    prompt_dict_keys: Optional[list] = None
    """veRL's: the fields inside ``prompt_key``'s dict that lead to the prompt, e.g. ``[question]`` with
    ``prompt_key=extra_info`` (null: the column is the prompt)."""
    response_dict_keys: Optional[list] = None
    """veRL's: the fields inside ``response_key``'s dict that lead to the response, e.g. ``[answer]``."""
    multiturn: MultiturnDataConfig = field(default_factory=MultiturnDataConfig)
    """Whole conversations: every assistant turn is trained on."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by ``max_token_len_per_gpu`` tokens instead of ``micro_batch_size_per_gpu``
    rows (veRL's engine SFT key)."""
    max_token_len_per_gpu: int = bounded(4096, ge=1, fix="use at least data.max_length")
    """Token budget of one forward/backward when ``use_dynamic_bsz`` is true (>= ``max_length``)."""
    max_prompt_length: int = bounded(128, ge=1, fix="use e.g. 128 tokens")
    """Held-out generations: prompts longer than this are dropped."""
    max_response_length: int = bounded(16, ge=1, fix="use e.g. 256 tokens")
    """Held-out generations: most tokens of an answer."""
    reward_fn_key: str = "data_source"
    """Held-out generations: the column that picks the scorer (rule rewards are registered by it)."""


@dataclass
class RMDataConfig(SupervisedDataConfig):
    """Preference pairs (OpenRLHF's and TRL's column names; HH-RLHF and UltraFeedback shapes are read
    as they are, :mod:`hybrid_rl.data.preference`)."""

    micro_batch_size_per_gpu: int = bounded(8, ge=1, fix="use e.g. 8 pairs")
    """Pairs per forward/backward on one worker."""
    chosen_key: str = "chosen"
    """Column of the preferred response (OpenRLHF ``--chosen_key``)."""
    rejected_key: str = "rejected"
    """Column of the dispreferred response (OpenRLHF ``--rejected_key``)."""
    margin_key: str = "margin"
    """Optional column of how much better chosen is (TRL's ``margin``), subtracted inside the loss."""


@dataclass
class SupervisedModelConfig:
    """The model trained (veRL's SFT ``model.*``)."""

    partial_pretrain: str = DEFAULT_MODEL_PATH
    """Local HF folder of the starting model, or the embedded default model's id."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped inside the model folder."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward (less memory, ~30% more compute)."""
    use_remove_padding: bool = True
    """Pack the valid tokens of a micro-batch into one sequence (no compute on padding)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding, offload and mixed precision (``mixed_precision.param_dtype``: the compute dtype)."""

    def model_fields(self) -> dict[str, Any]:
        """The worker model config's fields these keys set."""
        return dict(path=self.partial_pretrain, trust_remote_code=self.trust_remote_code,
                    enable_gradient_checkpointing=self.enable_gradient_checkpointing,
                    use_remove_padding=self.use_remove_padding)


@dataclass
class SFTModelConfig(SupervisedModelConfig):
    """The model SFT trains, optionally through LoRA adapters."""

    lora_rank: int = bounded(0, ge=0, fix="use 0, or e.g. 32 for LoRA")
    """0 = train every parameter; > 0 = peft LoRA adapters of this rank on the frozen base."""
    lora_alpha: float = bounded(16, gt=0, fix="use e.g. 16")
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    target_modules: Any = "all-linear"
    """Modules that get adapters: all-linear or a list of module names."""

    def model_fields(self) -> dict[str, Any]:
        return {**super().model_fields(), "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "target_modules": self.target_modules}


@dataclass
class SupervisedOptimConfig:
    """AdamW and its schedule (veRL's SFT ``optim.*``)."""

    lr: float = bounded(1e-5, ge=0, fix="use a non-negative learning rate")
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = bounded(0.01, ge=0, fix="use 0 (none) or e.g. 0.01")
    """AdamW decoupled weight decay."""
    warmup_steps_ratio: float = bounded(0.0, ge=0, le=1, fix="use a fraction such as 0.1")
    """Fraction of the run's steps spent warming the learning rate up from 0."""
    lr_scheduler: str = "constant"
    """After warm-up: constant | cosine."""
    clip_grad: Optional[float] = bounded(1.0, gt=0, fix="use e.g. 1.0, or null (no clipping)")
    """Clip the gradient's global norm to this; null = no clipping."""

    def as_optim(self) -> OptimConfig:
        """The worker's optimizer config."""
        return OptimConfig(lr=self.lr, betas=list(self.betas), weight_decay=self.weight_decay,
                           lr_warmup_steps_ratio=self.warmup_steps_ratio, lr_scheduler_type=self.lr_scheduler)


SFT_LINKED_DEFAULTS: dict[str, str] = {
    "rollout.response_length": "data.max_response_length",
    "rollout.prompt_length": "data.max_prompt_length",
    "rollout.seed": "trainer.seed",
}
"""SFT's ``key -> the key it follows`` unless set (as PPO's ``LINKED_DEFAULTS``)."""


def _sft_rollout() -> RolloutConfig:
    return RolloutConfig(n=1)


supervised_rollout = linked_group("rollout", _sft_rollout, SFT_LINKED_DEFAULTS)
"""The default of a supervised mode's ``rollout`` section (SFT, DPO): ``n=1``, its lengths and seed
following :data:`SFT_LINKED_DEFAULTS`."""


def supervised_trainer(experiment_name: str) -> Callable[[], BaseTrainerConfig]:
    """The default of a supervised mode's ``trainer`` section (SFT, RM, DPO): one epoch (no step
    count), named ``experiment_name``."""
    return lambda: BaseTrainerConfig(experiment_name=experiment_name, total_training_steps=None, total_epochs=1)


@dataclass
class SFTConfig:
    """A supervised fine-tuning run (``python -m hybrid_rl.trainer.main_sft``)."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Conversations, their batching and the held-out prompts."""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """The model trained."""
    optim: SupervisedOptimConfig = field(default_factory=SupervisedOptimConfig)
    """Its optimizer."""
    rollout: RolloutConfig = field(default_factory=supervised_rollout)
    """The engine of the held-out generations (``val_kwargs``: greedy by default); ``n`` stays 1:
    SFT samples nothing to train on."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A scoring function for the held-out generations (null = the built-in scorers by data source)."""
    trainer: BaseTrainerConfig = field(default_factory=supervised_trainer("sft"))
    """Run length, devices, logging, validation and checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """ray.init arguments."""


@dataclass
class RMConfig:
    """A reward-model run on preference pairs (``python -m hybrid_rl.trainer.main_rm``)."""

    data: RMDataConfig = field(default_factory=RMDataConfig)
    """Preference pairs and their batching."""
    model: SupervisedModelConfig = field(default_factory=SupervisedModelConfig)
    """The backbone (usually the SFT model); a scalar head is added on top."""
    optim: SupervisedOptimConfig = field(default_factory=SupervisedOptimConfig)
    """Its optimizer."""
    trainer: BaseTrainerConfig = field(default_factory=supervised_trainer("reward_model"))
    """Run length, devices, logging, validation and checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """ray.init arguments."""


SFT_OBJECTIVE = "nll"
"""The objective an SFT run's actor trains (``hybrid_rl.objectives.supervised``)."""


def sft_actor_config(cfg: SFTConfig) -> ActorRolloutRefConfig:
    """The actor worker's config of an SFT run: the ``nll`` objective (the token-mean NLL of the
    target tokens), one optimizer step per ``data.train_batch_size`` rows, one pass over each batch."""
    d = cfg.data
    actor = ActorConfig(ppo_mini_batch_size=d.train_batch_size, ppo_micro_batch_size_per_gpu=d.micro_batch_size_per_gpu,
                        use_dynamic_bsz=d.use_dynamic_bsz, ppo_max_token_len_per_gpu=d.max_token_len_per_gpu,
                        objective={"name": SFT_OBJECTIVE}, ppo_epochs=1, grad_clip=cfg.optim.clip_grad,
                        optim=cfg.optim.as_optim(), fsdp_config=cfg.model.fsdp_config)
    return ActorRolloutRefConfig(model=ModelConfig(**cfg.model.model_fields()), actor=actor,
                                 rollout=replace(cfg.rollout, n=1))


def rm_critic_config(cfg: RMConfig) -> CriticConfig:
    """The reward-model worker's config (the value-model layout): one optimizer step per
    ``data.train_batch_size`` pairs, ``data.micro_batch_size_per_gpu`` pairs per forward/backward."""
    d = cfg.data
    model = CriticModelConfig(**cfg.model.model_fields(), fsdp_config=cfg.model.fsdp_config)
    return CriticConfig(model=model, optim=cfg.optim.as_optim(), rollout_n=1, ppo_mini_batch_size=d.train_batch_size,
                        ppo_micro_batch_size_per_gpu=d.micro_batch_size_per_gpu, grad_clip=cfg.optim.clip_grad)
