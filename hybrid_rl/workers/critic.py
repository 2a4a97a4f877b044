"""PPO critic on one data-parallel rank: values and clipped value-loss updates (no Ray inside).

The value model is the backbone with a one-output token-classification head; ``values[:, r]`` is
read at the column that predicts response token ``r`` (the state before it is generated). The update
loop mirrors the actor's: global loss denominators per mini-batch, so micro-batch and data-parallel
splits give the gradient of the whole mini-batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch
from torch import nn

from hybrid_rl.algorithms import compute_value_loss, global_batch_denominators, masked_mean
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.batching import all_reduce_sum, restore_order, split_micro_batches
from hybrid_rl.workers.config import CriticConfig
from hybrid_rl.workers.forward import response_values
from hybrid_rl.workers.packing import batch_prompt_groups
from hybrid_rl.workers.fsdp_utils import dp_world, release_gathered, to_device
from hybrid_rl.workers.update_utils import check_mini_batch_rows, extend_metrics, mini_batches, optimizer_step
from hybrid_rl.workers.varlen_attention import use_varlen_attention

_MODEL_INPUTS = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask"]


class DataParallelPPOCritic:
    """Values and updates of ``critic_module`` on this rank's rows.

    Args:
        config: the critic section of the config.
        critic_module: HF token-classification model with ``num_labels=1`` (FSDP2 or plain).
        critic_optimizer: optimizer over its parameters (None: values only).
        ppo_mini_batch_size_per_gpu: rows per mini-batch on this rank (= ppo_mini_batch_size *
            rollout_n / dp_size); None = ``config.ppo_mini_batch_size * config.rollout_n``.
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
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.mini_batch_rows = ppo_mini_batch_size_per_gpu or config.ppo_mini_batch_size * config.rollout_n
        self.micro_batch_rows = ppo_micro_batch_size_per_gpu or config.ppo_micro_batch_size_per_gpu
        self.use_remove_padding = use_remove_padding
        # per-row attention, no [T, T] mask; its kernel chosen by device (attention_backend)
        varlen = use_remove_padding and use_varlen_attention(critic_module, attn_implementation, device,
                                                             "critic.model.attn_implementation")
        self.group_prompts = config.use_prefix_grouper and varlen  # one copy of each shared prompt
        self.device = torch.device(device)
        self.rank, self.dp_size = dp_world()
        self.num_skipped_steps = 0

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` (float32), zero outside ``response_mask``."""
        cfg = self.config
        micro_batches, order = split_micro_batches(
            data.select(batch_keys=_MODEL_INPUTS),
            micro_batch_size=cfg.forward_micro_batch_size_per_gpu or self.micro_batch_rows,
            use_dynamic_bsz=cfg.use_dynamic_bsz, max_token_len=cfg.ppo_max_token_len_per_gpu,
            key="critic.ppo_max_token_len_per_gpu", device=self.device, group_prompts=self.group_prompts)
        self.critic_module.eval()
        values = []
        for micro in micro_batches:  # host tensors: layouts built here, inputs copied asynchronously
            batch = dict(micro.batch.items())
            groups = batch_prompt_groups(batch, self.group_prompts)
            vpreds = response_values(self.critic_module, batch, self.use_remove_padding, groups, self.device)
            values.append(vpreds * to_device(batch["response_mask"], self.device))
        release_gathered(self.critic_module)
        return restore_order(torch.cat(values).cpu(), order)

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """Clipped value-loss update over ``data``; needs ``values`` and ``returns`` [B, R]."""
        if self.critic_optimizer is None:
            raise ValueError("update_critic needs an optimizer; this critic was built without one")
        keys = _MODEL_INPUTS + ["values", "returns"]
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise ValueError(f"update_critic: batch lacks {missing}; run compute_values and the "
                             "advantage estimator (returns) first")
        check_mini_batch_rows(len(data), self.mini_batch_rows, "critic")
        data = data.select(batch_keys=keys)
        metrics: dict[str, list[float]] = defaultdict(list)
        skipped_before = self.num_skipped_steps
        self.critic_module.train()
        for epoch in range(self.config.ppo_epochs):
            for mini in mini_batches(data, self.mini_batch_rows, self.config.shuffle, epoch):
                self._update_mini_batch(mini, metrics)
        self.critic_module.eval()
        metrics["critic/num_skipped_steps"].append(self.num_skipped_steps - skipped_before)
        return dict(metrics)

    def _update_mini_batch(self, mini: DataProto, metrics: dict[str, list[float]]) -> None:
        cfg = self.config
        # on the compute device once per mini-batch: a host scalar would be copied in every loss term
        denoms = {k: to_device(all_reduce_sum(v, self.device), self.device)
                  for k, v in global_batch_denominators(mini.batch["response_mask"]).items()}
        micro_batches, _ = split_micro_batches(
            mini, micro_batch_size=self.micro_batch_rows, use_dynamic_bsz=cfg.use_dynamic_bsz,
            max_token_len=cfg.ppo_max_token_len_per_gpu, key="critic.ppo_max_token_len_per_gpu",
            device=self.device, group_prompts=self.group_prompts)
        self.critic_optimizer.zero_grad(set_to_none=True)
        vf_loss_total = torch.zeros((), dtype=torch.float64, device=self.device)
        stats: dict[str, list] = defaultdict(list)
        for micro in micro_batches:  # host tensors: no per-micro-batch synchronisation of the device
            host = dict(micro.batch.items())
            vpreds = response_values(self.critic_module, host, self.use_remove_padding,
                                     batch_prompt_groups(host, self.group_prompts), self.device)  # [b, R]
            batch = {k: to_device(host[k], self.device) for k in ("response_mask", "returns", "values")}
            mask = batch["response_mask"]
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, batch["returns"], batch["values"], mask, cfg.cliprange_value,
                loss_agg_mode=cfg.loss_agg_mode, **denoms)
            (vf_loss * self.dp_size).backward()  # FSDP averages over ranks; the loss needs the sum
            vf_loss_total += vf_loss.detach().double()
            stats["critic/vf_clipfrac"].append(vf_clipfrac.detach())
            stats["critic/vpred_mean"].append(masked_mean(vpreds.detach(), mask))
        extend_metrics(metrics, stats)  # one copy to the host for the mini-batch
        metrics["critic/vf_loss"].append(float(all_reduce_sum(vf_loss_total, self.device)))
        grad_norm, skipped = optimizer_step(self.critic_module, self.critic_optimizer, cfg.grad_clip, "critic")
        self.num_skipped_steps += int(skipped)
        metrics["critic/grad_norm"].append(grad_norm)
