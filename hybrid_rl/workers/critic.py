"""PPO critic on one data-parallel rank: the :class:`~hybrid_rl.workers.learner.Learner` with the
value head and the ``value`` objective (no Ray inside).

The value model is the backbone with a one-output token-classification head; ``values[:, r]`` is
read at the column that predicts response token ``r`` (the state before it is generated;
:class:`~hybrid_rl.workers.heads.ValueHead`). ``update_critic`` is ``Learner.update`` with veRL's
clipped value loss (:mod:`hybrid_rl.objectives.value`) built from the critic section and the critic's
epochs and shuffling; the micro-batching, global denominators and optimizer step are the learner's.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from hybrid_rl.objectives.value import ValueConfig, ValueObjective
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.config import CriticConfig
from hybrid_rl.workers.heads import ValueHead
from hybrid_rl.workers.learner import Learner, ppo_role_batching

__all__ = ["DataParallelPPOCritic", "value_objective"]


def value_objective(config: CriticConfig) -> ValueObjective:
    """The ``value`` objective with the critic section's ``cliprange_value`` and ``loss_agg_mode``."""
    return ValueObjective(ValueConfig(cliprange_value=config.cliprange_value, loss_agg_mode=config.loss_agg_mode))


class DataParallelPPOCritic(Learner):
    """Values and updates of ``critic_module`` on this rank's rows.

    Args:
        config: the critic section of the config.
        critic_module: HF token-classification model with ``num_labels=1`` (FSDP2 or plain).
        critic_optimizer: optimizer over its parameters (None: values only).
        ppo_mini_batch_size_per_gpu: rows per mini-batch on this rank (= ppo_mini_batch_size *
            rollout_n / dp_size); None = ``config.ppo_mini_batch_size * config.rollout_n``.
        ppo_micro_batch_size_per_gpu: rows per micro-batch on this rank; None = the config's.
        use_remove_padding: pack valid tokens instead of running on padding.
        device: where micro-batches are moved for compute.
        attn_implementation: ``*.model.attn_implementation``, the packed-attention kernel
            (:mod:`hybrid_rl.workers.attention_backend`); None = this process's current choice.
    """

    def __init__(self, config: CriticConfig, critic_module: nn.Module,
                 critic_optimizer: Optional[torch.optim.Optimizer] = None, *,
                 ppo_mini_batch_size_per_gpu: Optional[int] = None,
                 ppo_micro_batch_size_per_gpu: Optional[int] = None,
                 use_remove_padding: bool = False, device: torch.device | str = "cpu",
                 attn_implementation: Optional[str] = None):
        super().__init__(critic_module, critic_optimizer,
                         mini_batch_rows=ppo_mini_batch_size_per_gpu or config.ppo_mini_batch_size * config.rollout_n,
                         **ppo_role_batching(config, "critic", ppo_micro_batch_size_per_gpu),
                         use_remove_padding=use_remove_padding, device=device,
                         attn_implementation=attn_implementation, head=ValueHead(),
                         attn_key="critic.model.attn_implementation",
                         learner_metrics=("grad_norm", "num_skipped_steps"))
        self.config = config
        self.objective = value_objective(config)

    @property
    def critic_module(self) -> nn.Module:
        """The value model (the learner's ``module``)."""
        return self.module

    @property
    def critic_optimizer(self) -> Optional[torch.optim.Optimizer]:
        """Its optimizer (the learner's ``optimizer``)."""
        return self.optimizer

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` (float32), zero outside ``response_mask``; micro-batches of
        ``forward_micro_batch_size_per_gpu`` rows (default: the update's)."""
        values = self.compute_scores(data, micro_batch_rows=self.config.forward_micro_batch_size_per_gpu)
        return values * data.batch["response_mask"]

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """Clipped value-loss update over ``data``; needs ``values`` and ``returns`` [B, R] (and
        ``response_mask``); returns ``critic/vf_loss``, ``/vf_clipfrac``, ``/vpred_mean``,
        ``/grad_norm``, ``/num_skipped_steps``."""
        cfg = self.config
        return self.update(data, self.objective, epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, metric_prefix="critic",
                           loss_agg_mode=cfg.loss_agg_mode, caller="update_critic")
