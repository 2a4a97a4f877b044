"""The mode-neutral learner on one data-parallel rank: forwards, micro-batching and optimizer steps of
a causal LM for any objective (no Ray inside).

``update(data, objective)`` runs ``epochs`` x mini-batches x micro-batches. Each micro-batch loss is
aggregated with the *global* denominators of its mini-batch (valid tokens / sequences summed over
all micro-batches and all ranks, see :mod:`hybrid_rl.algorithms.loss_agg`), so summing the
micro-batch gradients gives exactly the gradient of the whole mini-batch loss, whatever the split.
FSDP averages gradients over ranks; the loss is multiplied by ``dp_size`` to turn that into the sum.

The learner knows no objective: it asks ``objective.forward`` what the forward must compute
(entropies, their gradient, log-probs at top-K ids), ``objective.check_keys`` / ``input_keys`` which
batch keys it needs, hands each micro-batch to the objective as a
:class:`~hybrid_rl.objectives.base.MicroBatch`, sums the ``objective.summed`` metrics over the
micro-batches and ranks (one all_reduce per mini-batch) and appends the others per micro-batch.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from hybrid_rl.algorithms import global_batch_denominators
from hybrid_rl.objectives.base import ForwardNeeds, MicroBatch, Objective
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.memory import grad_bytes
from hybrid_rl.utils.profiling import phase
from hybrid_rl.workers.batching import all_reduce_sum, restore_order, split_micro_batches
from hybrid_rl.workers.forward import padding_fraction, response_log_probs
from hybrid_rl.workers.fsdp_utils import dp_world, release_gathered, to_device
from hybrid_rl.workers.packing import batch_prompt_groups, computed_tokens
from hybrid_rl.workers.topk_forward import response_log_probs_with_topk, response_topk
from hybrid_rl.workers.update_utils import check_mini_batch_rows, extend_metrics, mini_batches, optimizer_step
from hybrid_rl.workers.varlen_attention import use_varlen_attention

logger = logging.getLogger(__name__)

__all__ = ["Learner", "MODEL_INPUTS"]

MODEL_INPUTS = ["responses", "input_ids", "attention_mask", "position_ids"]
"""Batch keys the forward reads (never handed to an objective)."""

Metrics = dict[str, list[float]]


def require_meta(data: DataProto, keys: list[str], method: str) -> None:
    """ValueError naming the ``meta_info`` keys ``method`` needs that ``data`` lacks."""
    missing = [k for k in keys if k not in data.meta_info]
    if missing:
        raise ValueError(f"{method}: data.meta_info lacks {missing}; the worker sets them from the "
                         "rollout/actor config (temperature, micro_batch_size, use_dynamic_bsz, "
                         "max_token_len).")


class Learner:
    """Log-probs of ``module`` and updates of it by an objective, on this rank's share of a batch.

    Args:
        module: an HF causal LM, FSDP2-sharded or plain (single process).
        optimizer: optimizer over ``module``'s parameters; None for forward-only use (a reference).
        mini_batch_rows: rows of one mini-batch (one optimizer step) on this rank.
        micro_batch_rows: rows per forward/backward when ``use_dynamic_bsz`` is false.
        use_dynamic_bsz: pack rows into micro-batches of at most ``max_token_len`` tokens instead.
        max_token_len: token budget of a micro-batch with ``use_dynamic_bsz``.
        max_token_len_key: the config key of ``max_token_len`` (named when a row exceeds it).
        grad_clip: max global gradient norm; None: no clipping (the norm is still reported).
        use_prefix_grouper: rows of one micro-batch sharing a prompt run it once (varlen attention only).
        use_remove_padding: pack valid tokens instead of running on padding.
        device: where micro-batches are moved for compute.
        attn_implementation: the packed-attention kernel (:mod:`hybrid_rl.workers.attention_backend`);
            None = this process's current choice.
        fused_head: log-probs straight from the LM head's input (:mod:`hybrid_rl.workers.fused_head`).
        role: the config section's name in messages, logs and the learner's own metrics (``actor``).
    """

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 mini_batch_rows: int, micro_batch_rows: Optional[int] = None, use_dynamic_bsz: bool = False,
                 max_token_len: Optional[int] = None, max_token_len_key: str = "max_token_len",
                 grad_clip: Optional[float] = None, use_prefix_grouper: bool = True,
                 use_remove_padding: bool = False, device: torch.device | str = "cpu",
                 attn_implementation: Optional[str] = None, fused_head: bool = False, role: str = "learner"):
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_rows = mini_batch_rows
        self.micro_batch_rows = micro_batch_rows
        self.use_dynamic_bsz = use_dynamic_bsz
        self.max_token_len = max_token_len
        self.max_token_len_key = max_token_len_key
        self.grad_clip = grad_clip
        self.role = role
        self.fused_head = fused_head  # the LM head returns log-probs (model.use_fused_kernels)
        self.use_remove_padding = use_remove_padding
        # per-row attention, no [T, T] mask; its kernel chosen by device (attention_backend)
        varlen = use_remove_padding and use_varlen_attention(module, attn_implementation, device,
                                                             "actor_rollout_ref.model.attn_implementation")
        # prefix grouper: one copy of each shared prompt per micro-batch (needs the varlen attention)
        self.group_prompts = use_prefix_grouper and varlen
        self.token_counts = [0.0, 0.0]  # computed, valid tokens (since the last pop)
        self.device = torch.device(device)
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
                self.module, batch, temperature, self.use_remove_padding, calculate_entropy, groups=groups,
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
                self.module, batch, temperature, k, self.use_remove_padding, groups=groups, device=self.device,
                vocab_limit=vocab_limit))

    def _forward_micro_batches(self, data: DataProto, caller: str, forward) -> tuple[Optional[torch.Tensor], ...]:
        """``forward(batch, groups, temperature) -> tuple of [b, ...] tensors`` over the micro-batches of
        ``data`` (split by its meta_info), each output concatenated in ``data``'s row order (None where
        a micro-batch gave None)."""
        require_meta(data, ["temperature", "micro_batch_size", "use_dynamic_bsz"], caller)
        meta = data.meta_info
        micro_batches, order = split_micro_batches(
            data.select(batch_keys=MODEL_INPUTS), micro_batch_size=meta["micro_batch_size"],
            use_dynamic_bsz=meta["use_dynamic_bsz"], max_token_len=meta.get("max_token_len"),
            key="log_prob_max_token_len_per_gpu", device=self.device,
            group_prompts=self.group_prompts)
        self.module.eval()
        outputs = []
        for micro in micro_batches:  # host tensors: layouts are built here, inputs copied asynchronously
            batch = dict(micro.batch.items())
            groups = batch_prompt_groups(batch, self.group_prompts)
            self._count_tokens(batch, groups)
            outputs.append(forward(batch, groups, meta["temperature"]))
        release_gathered(self.module)
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

    # ------------------------------------------------------------------ updates
    def update(self, data: DataProto, objective: Objective, *, epochs: int = 1, shuffle: bool = False,
               metric_prefix: Optional[str] = None, loss_agg_mode: str = "token-mean", caller: str = "update",
               ) -> Metrics:
        """Minimise ``objective`` over ``data`` (this rank's rows): ``epochs`` passes of mini-batches of
        ``mini_batch_rows`` (permuted per epoch with ``shuffle``), one optimizer step each.

        Needs the model inputs, the objective's keys (it names the missing ones) and
        ``meta_info["temperature"]``; ``meta_info`` is also the objective's context (``bind``). The
        update is on-policy when it takes exactly one optimizer step (one epoch, one mini-batch).
        Returns metric lists: the objective's, and ``{metric_prefix}/padding_frac``, ``/grad_norm``,
        ``/num_skipped_steps`` (``metric_prefix`` None: the role).
        """
        if self.optimizer is None:
            raise ValueError(f"{caller} needs an optimizer; this {self.role} was built without one")
        require_meta(data, ["temperature"], caller)
        on_policy = epochs == 1 and len(data) == self.mini_batch_rows
        context = dict(data.meta_info)
        objective.bind(context)
        present = list(data.batch.keys())
        objective.check_keys(present, on_policy, caller=caller)
        check_mini_batch_rows(len(data), self.mini_batch_rows, self.role)
        data = data.select(batch_keys=list(dict.fromkeys(MODEL_INPUTS + objective.input_keys(present, on_policy))))
        metric_prefix = metric_prefix or self.role
        step = _Step(objective, objective.forward, data.meta_info["temperature"],
                     loss_agg_mode, on_policy, context, metric_prefix)
        metrics: Metrics = defaultdict(list)
        skipped_before = self.num_skipped_steps
        self.module.train()  # gradient checkpointing only runs in train mode
        for epoch in range(epochs):
            for mini in mini_batches(data, self.mini_batch_rows, shuffle, epoch):
                self._update_mini_batch(mini, step, metrics)
        self.module.eval()
        metrics[f"{metric_prefix}/num_skipped_steps"].append(self.num_skipped_steps - skipped_before)
        return dict(metrics)

    def _update_mini_batch(self, mini: DataProto, step: "_Step", metrics: Metrics) -> None:
        """Accumulate gradients over the micro-batches of ``mini`` and take one optimizer step."""
        # on the compute device once per mini-batch: a host scalar would be copied in every loss term
        denoms = {k: to_device(all_reduce_sum(v, self.device), self.device)
                  for k, v in global_batch_denominators(mini.batch["response_mask"]).items()}
        agg = dict(loss_agg_mode=step.loss_agg_mode, **denoms)
        micro_batches, _ = split_micro_batches(
            mini, micro_batch_size=self.micro_batch_rows, use_dynamic_bsz=self.use_dynamic_bsz,
            max_token_len=self.max_token_len, key=self.max_token_len_key, device=self.device,
            group_prompts=self.group_prompts)
        self.optimizer.zero_grad(set_to_none=True)
        summed = step.objective.summed
        # the summed metrics (the loss terms), accumulated where they are computed
        totals = torch.zeros(len(summed), dtype=torch.float64, device=self.device)
        stats: dict[str, list] = defaultdict(list)
        for micro in micro_batches:  # host tensors: no per-micro-batch synchronisation of the device
            batch = dict(micro.batch.items())
            metrics[f"{step.prefix}/padding_frac"].append(padding_fraction(batch["attention_mask"],
                                                                           self.use_remove_padding))
            groups = batch_prompt_groups(batch, self.group_prompts)
            self._count_tokens(batch, groups)
            loss, micro_metrics = self._micro_loss(batch, step, agg, groups)
            with phase("backward"):  # FSDP averages gradients over ranks; the global denominators need their sum.
                (loss * self.dp_size).backward()
            if summed:
                totals += torch.stack([micro_metrics.pop(name).detach().double() for name in summed])
            for name, value in micro_metrics.items():
                stats[name].append(value)
        with phase("metrics"):  # to the host once per mini-batch; one all_reduce for the sums
            extend_metrics(metrics, stats)
            totals = all_reduce_sum(totals, self.device)
            for name, value in zip(summed, totals.tolist()):
                metrics[name].append(value)
            for name, value in step.objective.step_metrics().items():
                metrics[name].append(value)
        self.last_grad_bytes = grad_bytes(self.module)  # held until the step clears them
        with phase("optimizer_step"):
            grad_norm, skipped = optimizer_step(self.module, self.optimizer, self.grad_clip, self.role)
        self.num_skipped_steps += int(skipped)
        metrics[f"{step.prefix}/grad_norm"].append(grad_norm)

    def _micro_loss(self, batch: dict[str, torch.Tensor], step: "_Step", agg: dict[str, Any],
                    groups: Optional[list[list[int]]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective's ``(loss, metrics)`` of one micro-batch (its share of the mini-batch loss)."""
        log_prob, entropy, topk = self._train_forward(batch, step.temperature, step.needs, groups)
        with phase("loss"):
            rest = {k: to_device(v, self.device) for k, v in batch.items() if k not in MODEL_INPUTS}
            micro = MicroBatch(rest, log_prob, agg, entropy=entropy, topk_log_prob=topk,
                               on_policy=step.on_policy, context=step.context)
            return step.objective(micro)

    def _train_forward(self, batch: dict[str, torch.Tensor], temperature: float, needs: ForwardNeeds,
                       groups: Optional[list[list[int]]]) -> tuple[torch.Tensor, Optional[torch.Tensor], ...]:
        """``(log-probs [b, R], entropies [b, R] | None, log-probs at the top-K ids [b, R, K] | None)``
        with gradient, as ``needs`` asks."""
        if needs.topk_ids_key:  # the logits themselves are needed: no fused head
            return response_log_probs_with_topk(self.module, batch, temperature, batch[needs.topk_ids_key],
                                                self.use_remove_padding, entropy_grad=needs.entropy_grad,
                                                groups=groups, device=self.device)
        log_prob, entropy = response_log_probs(self.module, batch, temperature, self.use_remove_padding,
                                               calculate_entropy=needs.entropy, entropy_grad=needs.entropy_grad,
                                               groups=groups, device=self.device, fused_head=self.fused_head)
        return log_prob, entropy, None


@dataclass(frozen=True)
class _Step:
    """What one update's micro-batches share."""

    objective: Objective
    """The objective being minimised."""
    needs: ForwardNeeds
    """What its forward computes (``objective.forward``, read once per update)."""
    temperature: float
    """The logits are divided by it (``meta_info["temperature"]``, the rollout's)."""
    loss_agg_mode: str
    """How token losses aggregate (``MicroBatch.agg``)."""
    on_policy: bool
    """The update takes exactly one optimizer step (``MicroBatch.on_policy``)."""
    context: dict[str, Any]
    """The caller's ``meta_info`` (``MicroBatch.context``)."""
    prefix: str
    """Prefix of the learner's own metrics (``actor``: ``actor/grad_norm``)."""
