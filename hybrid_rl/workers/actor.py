"""PPO actor on one data-parallel rank: log-probs and policy updates (no Ray inside).

``update_policy`` runs ``ppo_epochs`` x mini-batches x micro-batches. Each micro-batch loss is
aggregated with the *global* denominators of its mini-batch (valid tokens / sequences summed over
all micro-batches and all ranks, see :mod:`hybrid_rl.algorithms.loss_agg`), so summing the
micro-batch gradients gives exactly the gradient of the whole mini-batch loss, whatever the split.
FSDP averages gradients over ranks; the loss is multiplied by ``dp_size`` to turn that into the sum.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Optional

import torch
from torch import nn

from hybrid_rl.algorithms import agg_loss, behaviour_weight_stats, get_policy_loss_fn, global_batch_denominators, kl_penalty
from hybrid_rl.algorithms.distillation import distillation_loss_info
from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig, bypass_policy_loss
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.memory import grad_bytes
from hybrid_rl.utils.profiling import phase
from hybrid_rl.workers.batching import all_reduce_sum, restore_order, split_micro_batches
from hybrid_rl.workers.config import ActorConfig
from hybrid_rl.workers.distill_loss import add_distillation
from hybrid_rl.workers.distillation_config import DistillationLossConfig
from hybrid_rl.workers.forward import padding_fraction, response_log_probs
from hybrid_rl.workers.fsdp_utils import dp_world, release_gathered, to_device
from hybrid_rl.workers.packing import batch_prompt_groups, computed_tokens
from hybrid_rl.workers.topk_forward import response_log_probs_with_topk, response_topk
from hybrid_rl.workers.varlen_attention import use_varlen_attention
from hybrid_rl.workers.update_utils import check_mini_batch_rows, extend_metrics, mini_batches, optimizer_step

logger = logging.getLogger(__name__)

_MODEL_INPUTS = ["responses", "input_ids", "attention_mask", "position_ids"]


def _require_meta(data: DataProto, keys: list[str], method: str) -> None:
    missing = [k for k in keys if k not in data.meta_info]
    if missing:
        raise ValueError(f"{method}: data.meta_info lacks {missing}; the worker sets them from the "
                         "rollout/actor config (temperature, micro_batch_size, use_dynamic_bsz, "
                         "max_token_len).")


class DataParallelPPOActor:
    """Computes log-probs and PPO updates of ``actor_module`` on this rank's share of a batch.

    Args:
        config: the actor section of the config.
        actor_module: an HF causal LM, FSDP2-sharded or plain (single process).
        actor_optimizer: optimizer over ``actor_module``'s parameters; None for log-prob-only
            use (the reference policy).
        ppo_mini_batch_size_per_gpu: rows of one mini-batch on this rank (= ppo_mini_batch_size *
            rollout.n / dp_size, computed by the worker); None = ``config.ppo_mini_batch_size``.
        use_remove_padding: pack valid tokens instead of running on padding.
        device: where micro-batches are moved for compute.
        attn_implementation: ``*.model.attn_implementation``, the packed-attention kernel
            (:mod:`hybrid_rl.workers.attention_backend`); None = this process's current choice.
        fused_head: log-probs straight from the LM head's input, no ``[N, V]`` logits held
            (``*.model.use_fused_kernels``, :mod:`hybrid_rl.workers.fused_head`).
        distillation: ``distillation.distillation_loss`` when distillation is enabled: the update
            reads ``teacher_log_prob`` and adds the distillation term (:mod:`hybrid_rl.workers.distill_loss`).
    """

    def __init__(self, config: ActorConfig, actor_module: nn.Module,
                 actor_optimizer: Optional[torch.optim.Optimizer] = None, *,
                 ppo_mini_batch_size_per_gpu: Optional[int] = None,
                 ppo_micro_batch_size_per_gpu: Optional[int] = None,
                 use_remove_padding: bool = False, device: torch.device | str = "cpu",
                 attn_implementation: Optional[str] = None, fused_head: bool = False,
                 distillation: Optional[DistillationLossConfig] = None):
        self.config = config
        self.distillation = distillation
        self.fused_head = fused_head  # the LM head returns log-probs (model.use_fused_kernels)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.mini_batch_rows = ppo_mini_batch_size_per_gpu or config.ppo_mini_batch_size
        # per-rank rows of a micro-batch (derive_batch_sizes: also from veRL's global micro-batch key)
        self.micro_batch_rows = ppo_micro_batch_size_per_gpu or config.ppo_micro_batch_size_per_gpu
        self._bypass: Optional[RolloutCorrectionConfig] = None  # bypass mode's correction, per update_policy
        self.use_remove_padding = use_remove_padding
        # per-row attention, no [T, T] mask; its kernel chosen by device (attention_backend)
        varlen = use_remove_padding and use_varlen_attention(actor_module, attn_implementation, device,
                                                             "actor_rollout_ref.model.attn_implementation")
        # prefix grouper: one copy of each shared prompt per micro-batch (needs the varlen attention)
        self.group_prompts = config.use_prefix_grouper and varlen
        self.token_counts = [0.0, 0.0]  # computed, valid tokens (since the last pop)
        self.device = torch.device(device)
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.rank, self.dp_size = dp_world()
        self.num_skipped_steps = 0  # optimizer steps skipped so far (non-finite gradient norm)
        self.last_grad_bytes = 0  # gradient bytes held at the last optimizer step (memory breakdown)

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probs ``[B, R]`` (and entropies ``[B, R]``) of ``data["responses"]``.

        ``data.meta_info`` must hold ``temperature``, ``micro_batch_size``, ``use_dynamic_bsz``
        and (dynamic) ``max_token_len``. Logits are divided by the temperature, as in sampling.
        """
        log_prob, entropy = self._forward_micro_batches(
            data, "compute_log_prob", lambda batch, groups, temperature: response_log_probs(
                self.actor_module, batch, temperature, self.use_remove_padding, calculate_entropy, groups=groups,
                device=self.device, fused_head=self.fused_head))
        return log_prob, entropy if calculate_entropy else None

    @torch.no_grad()
    def compute_topk(self, data: DataProto, k: int, vocab_limit: Optional[int] = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(top-K log-probs [B, R, K], their ids [B, R, K], log-probs of the responses [B, R])``
        (``forward_kl_topk``'s teacher pass; micro-batched as :meth:`compute_log_prob`); the ids are
        ``< vocab_limit`` when given (:func:`response_topk`)."""
        return self._forward_micro_batches(
            data, "compute_topk", lambda batch, groups, temperature: response_topk(
                self.actor_module, batch, temperature, k, self.use_remove_padding, groups=groups, device=self.device,
                vocab_limit=vocab_limit))

    def _forward_micro_batches(self, data: DataProto, caller: str, forward) -> tuple[Optional[torch.Tensor], ...]:
        """``forward(batch, groups, temperature) -> tuple of [b, ...] tensors`` over the micro-batches of
        ``data`` (split by its meta_info), each output concatenated in ``data``'s row order (None where
        a micro-batch gave None)."""
        _require_meta(data, ["temperature", "micro_batch_size", "use_dynamic_bsz"], caller)
        meta = data.meta_info
        micro_batches, order = split_micro_batches(
            data.select(batch_keys=_MODEL_INPUTS), micro_batch_size=meta["micro_batch_size"],
            use_dynamic_bsz=meta["use_dynamic_bsz"], max_token_len=meta.get("max_token_len"),
            key="log_prob_max_token_len_per_gpu", device=self.device,
            group_prompts=self.group_prompts)
        self.actor_module.eval()
        outputs = []
        for micro in micro_batches:  # host tensors: layouts are built here, inputs copied asynchronously
            batch = dict(micro.batch.items())
            groups = batch_prompt_groups(batch, self.group_prompts)
            self._count_tokens(batch, groups)
            outputs.append(forward(batch, groups, meta["temperature"]))
        release_gathered(self.actor_module)
        # one copy back to the host per output and call, not one per micro-batch
        return tuple(None if parts[0] is None else restore_order(torch.cat(parts).cpu(), order)
                     for parts in zip(*outputs))

    def _count_tokens(self, batch: dict[str, torch.Tensor], groups: Optional[list[list[int]]]) -> None:
        mask = batch["attention_mask"]
        computed = computed_tokens(mask, batch["responses"].shape[1], self.use_remove_padding, groups)
        self.token_counts[0] += computed
        self.token_counts[1] += float(mask.sum())

    def pop_computed_token_frac(self) -> float:
        """Tokens run through the model / valid tokens since the last call (1 = packed rows, > 1 =
        padding computed, < 1 = shared prompts computed once); resets the counts."""
        computed, valid = self.token_counts
        self.token_counts = [0.0, 0.0]
        return computed / valid if valid else float("nan")

    # ------------------------------------------------------------------ policy update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update over ``data`` (this rank's rows); returns metric lists with veRL names.

        Needs batch keys ``responses, response_mask, input_ids, attention_mask, position_ids,
        old_log_probs, advantages`` (+ ``ref_log_prob`` with ``use_kl_loss``) and
        ``meta_info["temperature"]``. When the update is exactly on-policy (one mini-batch, one
        epoch: the weights that sampled are the weights being updated) ``old_log_probs`` may be
        absent; ``log_probs.detach()`` is then used (ratio exactly 1, as veRL's ``on_policy``), so
        the trainer can skip the separate old-log-prob pass.
        """
        if self.actor_optimizer is None:
            raise ValueError("update_policy needs an optimizer; this actor was built without one")
        _require_meta(data, ["temperature"], "update_policy")
        # on-policy without a precomputed old_log_probs: use the detached log-probs instead
        detach_old = self.is_on_policy(len(data)) and "old_log_probs" not in data.batch.keys()
        keys = _MODEL_INPUTS + ["response_mask", "advantages"] + ([] if detach_old else ["old_log_probs"])
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        if self.distillation is not None:
            keys += ["teacher_log_prob"] + (["teacher_topk_ids", "teacher_topk_log_probs"]
                                            if distillation_loss_info(self.distillation.loss_mode).use_topk else [])
        # behaviour log-probs (the decoupled loss, bypass mode) and the rollout correction's weights
        keys += [k for k in ("rollout_log_probs", "rollout_is_weights") if k in data.batch.keys()]
        correction = data.meta_info.get("rollout_correction")  # bypass mode: the loss corrects itself
        if correction is not None and "rollout_log_probs" not in keys:
            raise ValueError("algorithm.rollout_correction.bypass_mode=true needs the rollout's log-probs: set "
                             "actor_rollout_ref.rollout.calculate_log_probs=true.")
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise ValueError(f"update_policy: batch lacks {missing} (actor.use_kl_loss="
                             f"{self.config.use_kl_loss}); compute them before update_actor")
        check_mini_batch_rows(len(data), self.mini_batch_rows, "actor")
        data = data.select(batch_keys=keys)
        self._bypass = RolloutCorrectionConfig(**correction) if correction is not None else None
        metrics: dict[str, list[float]] = defaultdict(list)
        skipped_before = self.num_skipped_steps
        self.actor_module.train()  # gradient checkpointing only runs in train mode
        for epoch in range(self.config.ppo_epochs):
            for mini in mini_batches(data, self.mini_batch_rows, self.config.shuffle, epoch):
                self._update_mini_batch(mini, data.meta_info["temperature"], metrics, detach_old)
        self.actor_module.eval()
        metrics["actor/num_skipped_steps"].append(self.num_skipped_steps - skipped_before)
        return dict(metrics)

    def is_on_policy(self, num_rows: int) -> bool:
        """True when ``update_policy`` on ``num_rows`` rows takes exactly one optimizer step."""
        return self.config.ppo_epochs == 1 and num_rows == self.mini_batch_rows

    def _update_mini_batch(self, mini: DataProto, temperature: float,
                           metrics: dict[str, list[float]], detach_old: bool) -> None:
        """Accumulate gradients over the micro-batches of ``mini`` and take one optimizer step."""
        cfg = self.config
        # on the compute device once per mini-batch: a host scalar would be copied in every loss term
        denoms = {k: to_device(all_reduce_sum(v, self.device), self.device)
                  for k, v in global_batch_denominators(mini.batch["response_mask"]).items()}
        micro_batches, _ = split_micro_batches(
            mini, micro_batch_size=self.micro_batch_rows,
            use_dynamic_bsz=cfg.use_dynamic_bsz, max_token_len=cfg.ppo_max_token_len_per_gpu,
            key="actor.ppo_max_token_len_per_gpu", device=self.device,
            group_prompts=self.group_prompts)
        self.actor_optimizer.zero_grad(set_to_none=True)
        # pg_loss, entropy, kl_loss, distillation contributions, summed where they are computed
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        stats: dict[str, list] = defaultdict(list)
        for micro in micro_batches:  # host tensors: no per-micro-batch synchronisation of the device
            batch = dict(micro.batch.items())
            metrics["actor/padding_frac"].append(padding_fraction(batch["attention_mask"],
                                                                  self.use_remove_padding))
            groups = batch_prompt_groups(batch, self.group_prompts)
            self._count_tokens(batch, groups)
            loss, parts, micro_stats = self._micro_loss(batch, temperature, denoms, detach_old, groups)
            with phase("backward"):  # FSDP averages gradients over ranks; the global denominators need their sum.
                (loss * self.dp_size).backward()
            totals += parts
            for name, value in micro_stats.items():
                stats[name].append(value)
        with phase("metrics"):
            self._gather_metrics(metrics, stats, totals)
        self.last_grad_bytes = grad_bytes(self.actor_module)  # held until the step clears them
        with phase("optimizer_step"):
            grad_norm, skipped = optimizer_step(self.actor_module, self.actor_optimizer, cfg.grad_clip, "actor")
        self.num_skipped_steps += int(skipped)
        metrics["actor/grad_norm"].append(grad_norm)

    def _gather_metrics(self, metrics: dict[str, list[float]], stats: dict[str, list],
                        totals: torch.Tensor) -> None:
        """The mini-batch's metrics on the host: the micro-batches' statistics and the loss sums
        ``totals`` ``[4]`` (pg, entropy, kl, distillation; summed over ranks here)."""
        extend_metrics(metrics, stats)
        totals = all_reduce_sum(totals, self.device)
        metrics["actor/pg_loss"].append(float(totals[0]))
        metrics["actor/entropy"].append(float(totals[1]))
        if self.config.use_kl_loss:
            metrics["actor/kl_loss"].append(float(totals[2]))
            metrics["actor/kl_coef"].append(self.config.kl_loss_coef)
        if self.distillation is not None:
            metrics["actor/distillation/loss"].append(float(totals[3]))

    def _micro_loss(self, batch: dict[str, torch.Tensor], temperature: float,
                    denoms: dict[str, torch.Tensor], detach_old: bool,
                    groups: Optional[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Loss of one micro-batch (its share of the mini-batch loss) and its metrics."""
        cfg = self.config
        # entropy is always reported; it only needs a gradient when it is part of the loss
        student_topk = None
        if "teacher_topk_ids" in batch:  # forward_kl_topk: the student's log-probs at the teacher's top-K
            log_prob, entropy, student_topk = response_log_probs_with_topk(
                self.actor_module, batch, temperature, batch["teacher_topk_ids"], self.use_remove_padding,
                entropy_grad=cfg.entropy_coeff != 0, groups=groups, device=self.device)
        else:
            log_prob, entropy = response_log_probs(self.actor_module, batch, temperature,
                                                   self.use_remove_padding, calculate_entropy=True,
                                                   entropy_grad=cfg.entropy_coeff != 0, groups=groups,
                                                   device=self.device, fused_head=self.fused_head)
        with phase("loss"):
            return self._loss_terms(batch, log_prob, entropy, student_topk, denoms, detach_old)

    def _loss_terms(self, batch: dict[str, torch.Tensor], log_prob: torch.Tensor, entropy: torch.Tensor,
                    student_topk: Optional[torch.Tensor], denoms: dict[str, torch.Tensor],
                    detach_old: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """:meth:`_micro_loss` from the micro-batch's log-probs and entropies ``[b, R]``."""
        cfg = self.config
        batch = {k: to_device(v, self.device) for k, v in batch.items() if k not in _MODEL_INPUTS}
        mask = batch["response_mask"]
        old_log_prob = log_prob.detach() if detach_old else batch["old_log_probs"]
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, **denoms)
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), corr_stats = self._policy_loss(
            batch, log_prob, old_log_prob, agg)
        entropy_term = agg_loss(entropy, mask, cfg.loss_agg_mode, denoms["global_batch_num_tokens"],
                                denoms["global_batch_num_seqs"])
        loss = pg_loss - cfg.entropy_coeff * entropy_term
        kl_term = pg_loss.new_zeros(())
        if cfg.use_kl_loss:
            kl = kl_penalty(log_prob, batch["ref_log_prob"], cfg.kl_loss_type)  # [B, R]
            kl_term = agg_loss(kl, mask, cfg.loss_agg_mode, denoms["global_batch_num_tokens"],
                               denoms["global_batch_num_seqs"])
            loss = loss + cfg.kl_loss_coef * kl_term
        distill_term, distill_stats = pg_loss.new_zeros(()), {}
        if self.distillation is not None:
            loss, distill_term, distill_stats = add_distillation(loss, log_prob, old_log_prob, batch, agg,
                                                                 self.distillation, student_topk)
        parts = torch.stack([pg_loss.detach(), entropy_term.detach(), kl_term.detach(), distill_term]).double()
        stats = {"actor/pg_clipfrac": pg_clipfrac, "actor/ppo_kl": ppo_kl,
                 "actor/pg_clipfrac_lower": pg_clipfrac_lower}  # None: a loss that clips nothing (bypass reinforce)
        stats = {k: v.detach() for k, v in stats.items() if v is not None}
        stats = {**stats, **corr_stats, **distill_stats}  # to the host once per mini-batch
        if "rollout_log_probs" in batch:  # how far the sampling engine's policy is from the proximal one
            weights = behaviour_weight_stats(old_log_prob, batch["rollout_log_probs"], mask,
                                             cfg.policy_loss.behav_imp_weight_cap)
            stats.update({f"actor/{k}": v for k, v in weights.items()})
        return loss, parts, stats

    def _policy_loss(self, batch: dict[str, torch.Tensor], log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                     agg: dict) -> tuple[tuple[torch.Tensor, ...], dict[str, float]]:
        """``((pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), rollout-correction metrics)`` of the
        registered loss; in bypass mode its weights and rejections against the current policy."""
        settings = self.config.loss_settings()  # clip ratios and each loss's own keys
        if self._bypass is not None:  # ppo_clip runs the configured loss, with all its settings
            *out, corr = bypass_policy_loss(self.policy_loss_fn, log_prob, batch["rollout_log_probs"],
                                            batch["advantages"], batch["response_mask"], self._bypass, **settings,
                                            **agg)
            return tuple(out), corr
        return self.policy_loss_fn(
            old_log_prob, log_prob, batch["advantages"], batch["response_mask"], **settings,
            rollout_log_probs=batch.get("rollout_log_probs"), rollout_is_weights=batch.get("rollout_is_weights"),
            **agg), {}
