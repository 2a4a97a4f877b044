"""Objectives as objects: what a learner minimises on one micro-batch, and how terms compose.

An :class:`Objective` owns its config dataclass (``Config``), declares the batch keys it reads
(``reads``, ``optional_reads``) and the ones it produces (``writes``), and returns
``(loss, metrics)`` under its own metric names. A :class:`WeightedSum` composes terms with weights
(PPO = policy loss - entropy_coeff * entropy + kl_loss_coef * KL [+ distillation]); a term with weight
0 is still computed and reported (the entropy is always logged) but adds nothing to the loss.

The learner (:mod:`hybrid_rl.workers.learner`) knows no objective: per micro-batch it runs the
forward the objective asks for (:attr:`Objective.forward`), builds a :class:`MicroBatch` and calls
the objective. Metrics named in :attr:`Objective.summed` are the micro-batch's share of a mini-batch
quantity (the losses, aggregated with global denominators): the learner sums them over micro-batches
and data-parallel ranks. Every other metric is a per-micro-batch statistic, appended as a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Optional

import torch

__all__ = ["ForwardNeeds", "MicroBatch", "Objective", "WeightedSum", "missing_keys"]


@dataclass(frozen=True)
class ForwardNeeds:
    """What the learner's forward must compute for an objective."""

    entropy: bool = False
    """Per-token entropies ``[b, R]`` (reported or trained)."""
    entropy_grad: bool = False
    """The entropies need a gradient (an entropy term with a non-zero weight)."""
    topk_ids_key: Optional[str] = None
    """Batch key of ``[b, R, K]`` token ids whose log-probs the forward also returns (top-K distillation)."""

    def merge(self, other: "ForwardNeeds") -> "ForwardNeeds":
        """Both objectives' needs."""
        if self.topk_ids_key and other.topk_ids_key and self.topk_ids_key != other.topk_ids_key:
            raise ValueError(f"two objectives ask for top-K log-probs at different ids ({self.topk_ids_key!r}, "
                             f"{other.topk_ids_key!r}); one forward computes one set")
        return ForwardNeeds(self.entropy or other.entropy, self.entropy_grad or other.entropy_grad,
                            self.topk_ids_key or other.topk_ids_key)


@dataclass
class MicroBatch:
    """One micro-batch as an objective sees it (tensors on the compute device).

    Shapes: b = rows of the micro-batch, R = response length, K = top-K ids.
    """

    batch: dict[str, torch.Tensor]
    """The micro-batch's keys other than the model inputs (``response_mask``, ``advantages``, ...)."""
    log_prob: Optional[torch.Tensor]
    """``[b, R]`` log-probs of the responses under the trained model (with grad); None for a
    scalar head."""
    agg: dict[str, Any]
    """``loss_agg_mode`` and the mini-batch's global denominators (``global_batch_num_tokens`` /
    ``global_batch_num_seqs``, summed over micro-batches and ranks): ``agg_loss(..., **agg)``."""
    entropy: Optional[torch.Tensor] = None
    """``[b, R]`` per-token entropies when :attr:`ForwardNeeds.entropy`."""
    topk_log_prob: Optional[torch.Tensor] = None
    """``[b, R, K]`` log-probs at ``batch[ForwardNeeds.topk_ids_key]`` when asked for."""
    scores: Optional[torch.Tensor] = None
    """A scalar head's outputs (with grad): ``[b]`` one score per row (reward model) or ``[b, R]`` one
    per response token (value model)."""
    on_policy: bool = False
    """The update is exactly on-policy (one epoch, one mini-batch): the weights that sampled are the
    weights being updated, so ``old_log_probs`` may be absent (:attr:`old_log_prob` detaches)."""
    context: dict[str, Any] = field(default_factory=dict)
    """Per-update settings from the caller's ``meta_info`` (e.g. ``rollout_correction`` in bypass mode)."""

    @property
    def mask(self) -> torch.Tensor:
        """``[b, R]`` the response tokens that count (``response_mask``)."""
        return self.batch["response_mask"]

    @property
    def old_log_prob(self) -> torch.Tensor:
        """``[b, R]`` the proximal policy's log-probs: ``old_log_probs``, or the detached current
        ones in an on-policy update that was given none (ratio exactly 1, veRL's ``on_policy``)."""
        old = self.batch.get("old_log_probs")
        if old is None:
            if not self.on_policy:
                raise ValueError("old_log_probs is missing and the update is not on-policy; run compute_log_prob first")
            return self.log_prob.detach()
        return old


def missing_keys(required: Iterable[str], present: Iterable[str]) -> list[str]:
    """The names of ``required`` that ``present`` lacks, in order."""
    have = set(present)
    return [k for k in required if k not in have]


class Objective:
    """One loss term (or a composition of them) over micro-batches.

    A subclass sets ``name``, ``Config`` (its config dataclass; the instance keeps it as
    ``self.config``), ``reads`` / ``optional_reads`` / ``writes`` and implements :meth:`__call__`.
    """

    name: ClassVar[str] = ""
    """The registry name (``hybrid_rl.objectives.registered_objectives()``)."""
    Config: ClassVar[Optional[type]] = None
    """Its config dataclass (None: it has no settings)."""
    reads: ClassVar[tuple[str, ...]] = ("response_mask",)
    """Batch keys it cannot run without (names of :data:`hybrid_rl.schema.BATCH_SCHEMA`)."""
    optional_reads: ClassVar[tuple[str, ...]] = ()
    """Batch keys it uses when present."""
    writes: ClassVar[tuple[str, ...]] = ()
    """Batch keys it produces (none for a loss)."""

    def __init__(self, config: Any = None):
        # None: the Config's defaults (an objective without settings keeps None)
        self.config = self.Config() if config is None and self.Config is not None else config

    # ---------------------------------------------------------------- declarations
    @property
    def forward(self) -> ForwardNeeds:
        """What the learner's forward must compute for this objective."""
        return ForwardNeeds()

    @property
    def summed(self) -> tuple[str, ...]:
        """Metric names that are shares of a mini-batch quantity (summed over micro-batches and ranks)."""
        return ()

    def step_metrics(self) -> dict[str, float]:
        """Metrics reported once per optimizer step, not per micro-batch (e.g. a fixed coefficient)."""
        return {}

    def required_keys(self, on_policy: bool = False) -> list[str]:
        """The batch keys this update needs (``on_policy``: :attr:`MicroBatch.on_policy`)."""
        return list(self.reads)

    def input_keys(self, present: Iterable[str], on_policy: bool = False) -> list[str]:
        """Every key it reads from a batch holding ``present``: the required ones, then the optional
        ones that are there."""
        have = set(present)
        return list(dict.fromkeys(self.required_keys(on_policy) + [k for k in self.optional_reads if k in have]))

    def check_keys(self, present: Iterable[str], on_policy: bool = False, *, caller: str = "update") -> None:
        """ValueError naming the keys it needs that ``present`` lacks."""
        missing = missing_keys(self.required_keys(on_policy), present)
        if missing:
            raise ValueError(f"{caller}: the {self.describe()} objective needs batch keys {missing} that the batch "
                             "lacks; compute them in an earlier step (hybrid_rl/schema.py says which step makes each)")

    def bind(self, context: dict[str, Any]) -> None:
        """Take the update's settings (from ``meta_info``) before its micro-batches; default: none."""

    def describe(self) -> str:
        """A short name for messages."""
        return self.name or type(self).__name__

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, metrics)`` of one micro-batch: its share of the mini-batch loss (a 0-dim tensor
        with grad) and its metrics (0-dim tensors, detached)."""
        raise TypeError(f"{type(self).__name__} does not define __call__; an objective must return (loss, metrics)")


class WeightedSum(Objective):
    """``sum_i weight_i * term_i``, the terms' metrics merged (each term names its own).

    A term with weight 0 is computed for its metrics and adds nothing to the loss (and no gradient).
    """

    name = "weighted_sum"

    def __init__(self, terms: list[tuple[Objective, float]]):
        super().__init__(None)
        if not terms:
            raise ValueError("a WeightedSum needs at least one term")
        self.terms = list(terms)

    @property
    def forward(self) -> ForwardNeeds:
        needs = ForwardNeeds()
        for term, weight in self.terms:
            need = term.forward
            if weight == 0:  # reported only: no gradient through its inputs
                need = ForwardNeeds(need.entropy, False, need.topk_ids_key)
            needs = needs.merge(need)
        return needs

    @property
    def summed(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for term, _ in self.terms for name in term.summed))

    def step_metrics(self) -> dict[str, float]:
        return {name: value for term, _ in self.terms for name, value in term.step_metrics().items()}

    def required_keys(self, on_policy: bool = False) -> list[str]:
        return list(dict.fromkeys(k for term, _ in self.terms for k in term.required_keys(on_policy)))

    def input_keys(self, present: Iterable[str], on_policy: bool = False) -> list[str]:
        present = list(present)
        return list(dict.fromkeys(k for term, _ in self.terms for k in term.input_keys(present, on_policy)))

    def check_keys(self, present: Iterable[str], on_policy: bool = False, *, caller: str = "update") -> None:
        present = list(present)
        for term, _ in self.terms:
            term.check_keys(present, on_policy, caller=caller)

    def bind(self, context: dict[str, Any]) -> None:
        for term, _ in self.terms:
            term.bind(context)

    def describe(self) -> str:
        return " + ".join(term.describe() for term, _ in self.terms)

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss: Optional[torch.Tensor] = None
        metrics: dict[str, torch.Tensor] = {}
        for term, weight in self.terms:
            value, term_metrics = term(mb)
            metrics.update(term_metrics)
            if weight == 0:
                continue
            if loss is None:  # 1.0 * x is x exactly, so a lone term's loss is unchanged
                loss = value if weight == 1 else weight * value
            else:
                loss = loss + weight * value
        if loss is None:
            raise ValueError(f"every term of {self.describe()} has weight 0: nothing to train")
        return loss, metrics
