"""The mode-neutral learner on one data-parallel rank: forwards, micro-batching and optimizer steps of
a model for any objective and head (no Ray inside).

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

The learner knows no mode either: its forward is a :class:`~hybrid_rl.workers.heads.Head` (log-probs
for a policy, per-token values for a critic, one score per sequence for a reward model), which names
its inputs and fills the micro-batch's ``log_prob`` / ``entropy`` / ``scores``. An objective whose rows
come in (chosen, rejected) pairs (:func:`objective_paired`) keeps rows ``2i`` and ``2i + 1`` in one
mini-batch and one micro-batch.
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
from hybrid_rl.objectives.registry import objective_info, registered_objectives
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.memory import grad_bytes
from hybrid_rl.utils.profiling import phase
from hybrid_rl.workers.batching import all_reduce_sum, check_whole_pairs, restore_order, split_micro_batches
from hybrid_rl.workers.forward import padding_fraction, response_log_probs
from hybrid_rl.workers.heads import ForwardOptions, Head, HeadOutput, LogProbHead
from hybrid_rl.workers.fsdp_utils import dp_world, release_gathered, to_device
from hybrid_rl.workers.packing import batch_prompt_groups, computed_tokens
from hybrid_rl.workers.topk_forward import response_topk
from hybrid_rl.workers.update_utils import check_mini_batch_rows, extend_metrics, mini_batches, optimizer_step
from hybrid_rl.workers.varlen_attention import use_varlen_attention

logger = logging.getLogger(__name__)

__all__ = ["LEARNER_METRICS", "Learner", "MODEL_INPUTS", "objective_paired"]

MODEL_INPUTS = list(LogProbHead.inputs)
"""Batch keys the log-prob forward reads (never handed to an objective)."""

LEARNER_METRICS = ("padding_frac", "grad_norm", "num_skipped_steps")
"""The learner's own metrics (``{metric_prefix}/<name>``), all reported by default."""

Metrics = dict[str, list[float]]


def require_meta(data: DataProto, keys: list[str], method: str) -> None:
    """ValueError naming the ``meta_info`` keys ``method`` needs that ``data`` lacks."""
    missing = [k for k in keys if k not in data.meta_info]
    if missing:
        raise ValueError(f"{method}: data.meta_info lacks {missing}; the worker sets them from the "
                         "rollout/actor config (temperature, micro_batch_size, use_dynamic_bsz, "
                         "max_token_len).")


def objective_paired(objective: Objective) -> bool:
    """Whether ``objective``'s rows come in (chosen, rejected) pairs (rows ``2i``, ``2i + 1``): its
    ``paired`` attribute when it has one, any term's for a composition (``terms``), else its registry
    entry's :attr:`~hybrid_rl.objectives.ObjectiveInfo.paired` (False when unregistered)."""
    explicit = getattr(objective, "paired", None)
    if explicit is not None:
        return bool(explicit)
    terms = getattr(objective, "terms", None)
    if terms:
        return any(objective_paired(term) for term, _ in terms)
    return objective.name in registered_objectives() and objective_info(objective.name).paired


def ppo_role_batching(config: Any, role: str, micro_batch_rows: Optional[int] = None) -> dict[str, Any]:
    """The :class:`Learner` keywords a PPO role's section sets under veRL's names (``actor`` /
    ``critic``: ``ppo_micro_batch_size_per_gpu``, ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``,
    ``grad_clip``, ``use_prefix_grouper``); ``micro_batch_rows``: this rank's rows, None = the section's."""
    return {"micro_batch_rows": micro_batch_rows or config.ppo_micro_batch_size_per_gpu,
            "use_dynamic_bsz": config.use_dynamic_bsz, "max_token_len": config.ppo_max_token_len_per_gpu,
            "max_token_len_key": f"{role}.ppo_max_token_len_per_gpu", "grad_clip": config.grad_clip,
            "use_prefix_grouper": config.use_prefix_grouper, "role": role}


class Learner:
    """Outputs of ``module`` and updates of it by an objective, on this rank's share of a batch.

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
        head: what the forward computes (:mod:`hybrid_rl.workers.heads`); default the log-prob head.
        attn_key: the config key of ``attn_implementation`` named in messages; None: leave the model's
            attention as it is (packed rows then get HF's mask rebuilt from the position ids).
        learner_metrics: which of :data:`LEARNER_METRICS` an update reports.
    """

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 mini_batch_rows: int, micro_batch_rows: Optional[int] = None, use_dynamic_bsz: bool = False,
                 max_token_len: Optional[int] = None, max_token_len_key: str = "max_token_len",
                 grad_clip: Optional[float] = None, use_prefix_grouper: bool = True,
                 use_remove_padding: bool = False, device: torch.device | str = "cpu",
                 attn_implementation: Optional[str] = None, fused_head: bool = False, role: str = "learner",
                 head: Optional[Head] = None,
                 attn_key: Optional[str] = "actor_rollout_ref.model.attn_implementation",
                 learner_metrics: tuple[str, ...] = LEARNER_METRICS):
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_rows = mini_batch_rows
        self.micro_batch_rows = micro_batch_rows
        self.use_dynamic_bsz = use_dynamic_bsz
        self.max_token_len = max_token_len
        self.max_token_len_key = max_token_len_key
        self.grad_clip = grad_clip
        self.role = role
        self.head = head if head is not None else LogProbHead()
        unknown = [m for m in learner_metrics if m not in LEARNER_METRICS]
        if unknown:
            raise ValueError(f"learner_metrics {unknown} are not learner metrics; valid: {list(LEARNER_METRICS)}")
        self.learner_metrics = tuple(learner_metrics)
        self.fused_head = fused_head  # the LM head returns log-probs (model.use_fused_kernels)
        self.use_remove_padding = use_remove_padding
        # per-row attention, no [T, T] mask; its kernel chosen by device (attention_backend)
        varlen = use_remove_padding and attn_key is not None and use_varlen_attention(
            module, attn_implementation, device, attn_key)
        # prefix grouper: one copy of each shared prompt per micro-batch (needs the varlen attention)
        self.group_prompts = use_prefix_grouper and varlen and self.head.shares_prompts
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
        temperature = data.meta_info.get("temperature")
        log_prob, entropy = self._forward_micro_batches(
            data, "compute_log_prob", lambda batch, groups: response_log_probs(
                self.module, batch, temperature, self.use_remove_padding, calculate_entropy, groups=groups,
                device=self.device, fused_head=self.fused_head))
        return log_prob, entropy if calculate_entropy else None

    @torch.no_grad()
    def compute_topk(self, data: DataProto, k: int, vocab_limit: Optional[int] = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(top-K log-probs [B, R, K], their ids [B, R, K], log-probs of the responses [B, R])``
        (``forward_kl_topk``'s teacher pass; micro-batched as :meth:`compute_log_prob`); the ids are
        ``< vocab_limit`` when given (:func:`response_topk`)."""
        temperature = data.meta_info.get("temperature")
        return self._forward_micro_batches(
            data, "compute_topk", lambda batch, groups: response_topk(
                self.module, batch, temperature, k, self.use_remove_padding, groups=groups, device=self.device,
                vocab_limit=vocab_limit))

    @torch.no_grad()
    def compute_scores(self, data: DataProto, micro_batch_rows: Optional[int] = None,
                       paired: bool = False) -> torch.Tensor:
        """The head's scores of ``data`` in its row order (``[B]`` or ``[B, R]``; no grad), micro-batched
        as an update is (``micro_batch_rows`` rows when given, else the learner's split); ``paired``:
        rows ``2i`` and ``2i + 1`` are pairs kept in one micro-batch."""
        split = dict(micro_batch_size=micro_batch_rows or self.micro_batch_rows, use_dynamic_bsz=self.use_dynamic_bsz,
                     max_token_len=self.max_token_len, key=self.max_token_len_key)
        options = self._forward_options()
        (scores,) = self._no_grad_pass(
            data.select(batch_keys=list(self.head.inputs)), split,
            lambda batch, groups: (self.head.scores(self.module, batch, groups, options, paired),), paired)
        return scores

    def _forward_micro_batches(self, data: DataProto, caller: str, forward) -> tuple[Optional[torch.Tensor], ...]:
        """``forward(batch, groups) -> tuple of [b, ...] tensors`` over the micro-batches of ``data``
        (split by its meta_info), each output concatenated in ``data``'s row order (None where a
        micro-batch gave None)."""
        require_meta(data, ["temperature", "micro_batch_size", "use_dynamic_bsz"], caller)
        meta = data.meta_info
        split = dict(micro_batch_size=meta["micro_batch_size"], use_dynamic_bsz=meta["use_dynamic_bsz"],
                     max_token_len=meta.get("max_token_len"), key="log_prob_max_token_len_per_gpu")
        return self._no_grad_pass(data.select(batch_keys=MODEL_INPUTS), split, forward)

    def _no_grad_pass(self, data: DataProto, split: dict[str, Any], forward,
                      paired: bool = False) -> tuple[Optional[torch.Tensor], ...]:
        """``forward`` over the micro-batches of ``data`` split by ``split`` (see :meth:`_forward_micro_batches`)."""
        micro_batches, order = split_micro_batches(data, **split, device=self.device, group_prompts=self.group_prompts,
                                                   paired=paired)
        self.module.eval()
        outputs = []
        for micro in micro_batches:  # host tensors: layouts are built here, inputs copied asynchronously
            batch = dict(micro.batch.items())
            groups = batch_prompt_groups(batch, self.group_prompts)
            self._count_tokens(batch, groups)
            outputs.append(forward(batch, groups))
        release_gathered(self.module)
        # one copy back to the host per output and call, not one per micro-batch
        return tuple(None if parts[0] is None else restore_order(torch.cat(parts).cpu(), order)
                     for parts in zip(*outputs))

    def _count_tokens(self, batch: dict[str, torch.Tensor], groups: Optional[list[list[int]]]) -> None:
        mask = batch["attention_mask"]
        response_length = batch["responses"].shape[1] if "responses" in batch else 0
        computed = computed_tokens(mask, response_length, self.use_remove_padding, groups)
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
               mini_batch_rows: Optional[int] = None) -> Metrics:
        """Minimise ``objective`` over ``data`` (this rank's rows): ``epochs`` passes of mini-batches of
        ``mini_batch_rows`` (None: the learner's; permuted per epoch with ``shuffle``), one optimizer step each.

        Needs the head's inputs, the objective's keys (it names the missing ones) and the head's
        ``meta_info`` keys (``temperature`` for log-probs); ``meta_info`` is also the objective's
        context (``bind``). The update is on-policy when it takes exactly one optimizer step (one
        epoch, one mini-batch). A paired objective's pairs stay whole (:func:`objective_paired`).
        Returns metric lists: the objective's, and the reported :data:`LEARNER_METRICS`
        ``{metric_prefix}/padding_frac``, ``/grad_norm``, ``/num_skipped_steps`` (``metric_prefix``
        None: the role).
        """
        if self.optimizer is None:
            raise ValueError(f"{caller} needs an optimizer; this {self.role} was built without one")
        rows = mini_batch_rows or self.mini_batch_rows
        data, step = self._prepare(data, objective, epochs == 1 and len(data) == rows, caller,
                                   loss_agg_mode, metric_prefix or self.role)
        check_mini_batch_rows(len(data), rows, self.role)
        if step.paired:
            self._check_pairs(len(data), rows)
        metrics: Metrics = defaultdict(list)
        skipped_before = self.num_skipped_steps
        self.module.train()  # gradient checkpointing only runs in train mode
        for epoch in range(epochs):
            for mini in mini_batches(data, rows, shuffle, epoch, paired=step.paired):
                self._update_mini_batch(mini, step, metrics)
        self.module.eval()
        if "num_skipped_steps" in self.learner_metrics:
            metrics[f"{step.prefix}/num_skipped_steps"].append(self.num_skipped_steps - skipped_before)
        return dict(metrics)

    def _prepare(self, data: DataProto, objective: Objective, on_policy: bool, caller: str, loss_agg_mode: str,
                 prefix: str) -> tuple[DataProto, "_Step"]:
        """Check ``data`` against the head and the objective; the rows' needed keys and the update's settings."""
        require_meta(data, list(self.head.meta_keys), caller)
        context = dict(data.meta_info)
        objective.bind(context)
        present = list(data.batch.keys())
        objective.check_keys(present, on_policy, caller=caller)
        needs = objective.forward
        self.head.check_needs(needs, objective.describe())
        keys = list(dict.fromkeys(list(self.head.inputs) + objective.input_keys(present, on_policy)))
        step = _Step(objective, needs, data.meta_info.get("temperature"), loss_agg_mode, on_policy, context,
                     prefix, objective_paired(objective))
        return data.select(batch_keys=keys), step

    def _check_pairs(self, num_rows: int, mini_batch_rows: int) -> None:
        """A paired objective's batch, mini-batches and fixed micro-batches hold whole pairs."""
        check_whole_pairs(num_rows, "the batch on this rank", "data.train_batch_size")
        check_whole_pairs(mini_batch_rows, "a mini-batch on this rank", f"{self.role}.ppo_mini_batch_size")
        if not self.use_dynamic_bsz and self.micro_batch_rows is not None:
            check_whole_pairs(self.micro_batch_rows, "a micro-batch", f"{self.role}.ppo_micro_batch_size_per_gpu")

    def _update_mini_batch(self, mini: DataProto, step: "_Step", metrics: Metrics) -> None:
        """Accumulate gradients over the micro-batches of ``mini`` and take one optimizer step."""
        # on the compute device once per mini-batch: a host scalar would be copied in every loss term
        denoms = {k: to_device(all_reduce_sum(v, self.device), self.device)
                  for k, v in global_batch_denominators(mini.batch[self.head.mask_key]).items()}
        agg = dict(loss_agg_mode=step.loss_agg_mode, **denoms)
        micro_batches, _ = split_micro_batches(
            mini, micro_batch_size=self.micro_batch_rows, use_dynamic_bsz=self.use_dynamic_bsz,
            max_token_len=self.max_token_len, key=self.max_token_len_key, device=self.device,
            group_prompts=self.group_prompts, paired=step.paired)
        self.optimizer.zero_grad(set_to_none=True)
        summed = step.objective.summed
        # the summed metrics (the loss terms), accumulated where they are computed
        totals = torch.zeros(len(summed), dtype=torch.float64, device=self.device)
        stats: dict[str, list] = defaultdict(list)
        for micro in micro_batches:  # host tensors: no per-micro-batch synchronisation of the device
            batch = dict(micro.batch.items())
            if "padding_frac" in self.learner_metrics:
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
        if "grad_norm" in self.learner_metrics:
            metrics[f"{step.prefix}/grad_norm"].append(grad_norm)

    def _forward_options(self) -> ForwardOptions:
        return ForwardOptions(self.use_remove_padding, self.device, self.fused_head)

    def _micro_loss(self, batch: dict[str, torch.Tensor], step: "_Step", agg: dict[str, Any],
                    groups: Optional[list[list[int]]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective's ``(loss, metrics)`` of one micro-batch (its share of the mini-batch loss)."""
        out: HeadOutput = self.head.forward(self.module, batch, groups, step.needs, step.temperature,
                                            self._forward_options(), step.paired)
        with phase("loss"):
            inputs = self.head.inputs
            rest = {k: to_device(v, self.device) for k, v in batch.items() if k not in inputs}
            micro = MicroBatch(rest, out.log_prob, agg, entropy=out.entropy, topk_log_prob=out.topk_log_prob,
                               scores=out.scores, on_policy=step.on_policy, context=step.context)
            return step.objective(micro)


@dataclass(frozen=True)
class _Step:
    """What one update's micro-batches share."""

    objective: Objective
    """The objective being minimised."""
    needs: ForwardNeeds
    """What its forward computes (``objective.forward``, read once per update)."""
    temperature: Optional[float]
    """The logits are divided by it (``meta_info["temperature"]``, the rollout's; log-prob head)."""
    loss_agg_mode: str
    """How token losses aggregate (``MicroBatch.agg``)."""
    on_policy: bool
    """The update takes exactly one optimizer step (``MicroBatch.on_policy``)."""
    context: dict[str, Any]
    """The caller's ``meta_info`` (``MicroBatch.context``)."""
    prefix: str
    """Prefix of the learner's own metrics (``actor``: ``actor/grad_norm``)."""
    paired: bool = False
    """Rows ``2i`` and ``2i + 1`` are (chosen, rejected) pairs kept in one mini- and micro-batch."""
