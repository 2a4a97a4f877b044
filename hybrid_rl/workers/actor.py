"""The actor on one data-parallel rank: the :class:`~hybrid_rl.workers.learner.Learner` with the
objective its config selects (no Ray inside).

``update_policy`` is ``Learner.update`` with :func:`~hybrid_rl.workers.objective_choice.actor_objective`
built from the actor section: the objective ``actor.objective`` names (``nll`` for SFT, ``dpo``, ...),
else PPO's (policy loss - entropy_coeff x entropy [+ kl_loss_coef x KL] [+ the distillation term]);
with the actor's epochs, shuffling and loss aggregation. The micro-batching, the global denominators
and the optimizer step are the learner's. ``DataParallelPPOActor`` is veRL's name for it.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.config import ActorConfig
from hybrid_rl.workers.distillation_config import DistillationLossConfig
from hybrid_rl.workers.learner import Learner, ppo_role_batching
from hybrid_rl.workers.objective_choice import actor_objective

logger = logging.getLogger(__name__)

__all__ = ["Actor", "DataParallelPPOActor", "actor_objective"]


class Actor(Learner):
    """Computes log-probs and updates of ``actor_module`` by its objective on this rank's share of a batch.

    Args:
        config: the actor section of the config.
        actor_module: an HF causal LM, FSDP2-sharded or plain (single process).
        actor_optimizer: optimizer over ``actor_module``'s parameters; None for log-prob-only
            use (the reference policy).
        ppo_mini_batch_size_per_gpu: rows of one mini-batch on this rank (= ppo_mini_batch_size *
            rollout.n / dp_size, computed by the worker); None = ``config.ppo_mini_batch_size``.
        ppo_micro_batch_size_per_gpu: per-rank rows of a micro-batch (the worker derives it, also
            from veRL's global micro-batch key); None = ``config.ppo_micro_batch_size_per_gpu``.
        use_remove_padding: pack valid tokens instead of running on padding.
        device: where micro-batches are moved for compute.
        attn_implementation: ``*.model.attn_implementation``, the packed-attention kernel
            (:mod:`hybrid_rl.workers.attention_backend`); None = this process's current choice.
        fused_head: log-probs straight from the LM head's input, no ``[N, V]`` logits held
            (``*.model.use_fused_kernels``, :mod:`hybrid_rl.workers.fused_head`).
        distillation: ``distillation.distillation_loss`` when distillation is enabled: the update
            reads ``teacher_log_prob`` and adds the distillation term (:mod:`hybrid_rl.objectives.distillation`);
            PPO's terms only (an objective selected by ``config.objective`` refuses it).
    """

    def __init__(self, config: ActorConfig, actor_module: nn.Module,
                 actor_optimizer: Optional[torch.optim.Optimizer] = None, *,
                 ppo_mini_batch_size_per_gpu: Optional[int] = None,
                 ppo_micro_batch_size_per_gpu: Optional[int] = None,
                 use_remove_padding: bool = False, device: torch.device | str = "cpu",
                 attn_implementation: Optional[str] = None, fused_head: bool = False,
                 distillation: Optional[DistillationLossConfig] = None):
        super().__init__(actor_module, actor_optimizer,
                         mini_batch_rows=ppo_mini_batch_size_per_gpu or config.ppo_mini_batch_size,
                         **ppo_role_batching(config, "actor", ppo_micro_batch_size_per_gpu),
                         use_remove_padding=use_remove_padding, device=device,
                         attn_implementation=attn_implementation, fused_head=fused_head)
        self.config = config
        self.distillation = distillation
        self.objective = actor_objective(config, distillation)  # an unknown policy loss fails here

    @property
    def actor_module(self) -> nn.Module:
        """The trained model (the learner's ``module``)."""
        return self.module

    @property
    def actor_optimizer(self) -> Optional[torch.optim.Optimizer]:
        """Its optimizer (the learner's ``optimizer``)."""
        return self.optimizer

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """An update by the objective over ``data`` (this rank's rows); returns metric lists, each
        named by its objective (PPO's: veRL names) and the learner's ``actor/*``.

        Needs the model inputs ``responses, input_ids, attention_mask, position_ids``, what the
        objective reads (``nll``: ``response_mask``; PPO's terms: ``response_mask, old_log_probs,
        advantages`` + ``ref_log_prob`` with ``use_kl_loss``, ``teacher_log_prob`` with
        distillation) and ``meta_info["temperature"]``. When a PPO update is exactly on-policy (one
        mini-batch, one epoch: the weights that sampled are the weights being updated)
        ``old_log_probs`` may be absent; ``log_probs.detach()`` is then used (ratio exactly 1, as
        veRL's ``on_policy``), so the trainer can skip the separate old-log-prob pass. Bypass mode's
        correction comes in ``meta_info["rollout_correction"]``. ``meta_info["one_optimizer_step"]``
        (online DPO, whose pair count varies per step) makes all of ``data`` one mini-batch.
        """
        cfg = self.config
        rows = len(data) if data.meta_info.get("one_optimizer_step") else None
        return self.update(data, self.objective, epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, metric_prefix="actor",
                           loss_agg_mode=cfg.loss_agg_mode, caller="update_policy", mini_batch_rows=rows)

    def is_on_policy(self, num_rows: int) -> bool:
        """True when ``update_policy`` on ``num_rows`` rows takes exactly one optimizer step."""
        return self.config.ppo_epochs == 1 and num_rows == self.mini_batch_rows


DataParallelPPOActor = Actor
"""veRL's name of the actor (its default objective is PPO's)."""
