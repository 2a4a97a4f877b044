"""The mode-neutral base of the workers that train a scalar-head model (a value model's layout: the
backbone with a one-output token-classification head): the critic and the reward model.

:class:`ScalarModelWorker` builds the model, its tokenizer, AdamW, the LR schedule and the optimizer
offload, derives the per-rank batch sizes, and saves / loads atomic checkpoints. What the model is
trained as (its head and objective, :mod:`hybrid_rl.workers.learner`) is the subclass's:
:class:`~hybrid_rl.workers.fsdp_workers.CriticWorker` (values, the clipped value loss) and
:class:`~hybrid_rl.workers.rm_worker.RewardModelWorker` (scores, Bradley-Terry) are siblings.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from hybrid_rl.single_controller import Dispatch, Worker, register
from hybrid_rl.workers import checkpoint as ckpt
from hybrid_rl.workers.builders import build_lr_scheduler, build_optimizer, build_value_model
from hybrid_rl.workers.config import CriticConfig, PerRankBatchSizes, derive_batch_sizes
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path
from hybrid_rl.workers.optimizer_offload import OptimizerOffload

__all__ = ["ScalarModelWorker"]


class ScalarModelWorker(Worker):
    """One device's scalar-head model (FSDP2 + AdamW), its schedule, offload and checkpoints.

    Args:
        config: a critic-shaped config (the ``critic`` section, or the reward model's built from its keys).
        total_training_steps: steps of the run, for the LR schedule (from the trainer).
    """

    config_key: ClassVar[str] = "critic"
    """The config section named in messages (``critic.model.path``, ``critic.optim``)."""

    def __init__(self, config: CriticConfig, total_training_steps: Optional[int] = None):
        super().__init__()
        if not isinstance(config, CriticConfig):
            raise TypeError(f"config must be a CriticConfig, got {type(config).__name__}")
        self.config = config
        self.total_training_steps = total_training_steps

    def build_scalar_model(self) -> PerRankBatchSizes:
        """Join the process group; build the model, tokenizer, optimizer, LR schedule and offload
        (the optimizer state left offloaded); return this rank's batch sizes."""
        self.init_process_group()
        cfg, key = self.config, self.config_key
        path = resolve_model_path(cfg.model.path, key=f"{key}.model.path")
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or path,
                                        trust_remote_code=cfg.model.trust_remote_code)
        self.module = build_value_model(cfg.model, path, cfg.model.fsdp_config, self.device)
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.optim, key=f"{key}.optim",
                                               total_training_steps=self.total_training_steps)
        self.optimizer_offload = OptimizerOffload(self.optimizer, cfg.model.fsdp_config.optimizer_offload, self.device)
        return derive_batch_sizes(key=key, ppo_mini_batch_size=cfg.ppo_mini_batch_size,
                                  n=cfg.rollout_n, dp_size=self.world_size,
                                  ppo_micro_batch_size_per_gpu=cfg.ppo_micro_batch_size_per_gpu,
                                  ppo_micro_batch_size=cfg.ppo_micro_batch_size,
                                  log_prob_micro_batch_size_per_gpu=cfg.forward_micro_batch_size_per_gpu)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None, global_step: int = 0,
                        max_ckpt_to_keep: Optional[int] = None) -> None:
        """Write the model to ``local_path`` atomically (see the actor's save_checkpoint)."""
        c = self.config.checkpoint
        ckpt.save_checkpoint(local_path, model=self.module, optimizer=self.optimizer,
                             lr_scheduler=self.lr_scheduler, hf_config=self.module.config,
                             tokenizer=self.tokenizer, contents=tuple(c.save_contents),
                             state_dict_type=c.state_dict_type, global_step=global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None,
                        del_local_after_load: bool = False) -> None:
        """Restore what ``checkpoint.load_contents`` names."""
        with self.optimizer_offload:
            ckpt.load_checkpoint(local_path, model=self.module, optimizer=self.optimizer,
                                 lr_scheduler=self.lr_scheduler,
                                 contents=tuple(self.config.checkpoint.load_contents))
