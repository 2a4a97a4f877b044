"""Heads: what a learner's forward computes from a micro-batch, chosen by an object, not by a mode.

* :class:`LogProbHead` — log-probs of the response tokens (and entropies, top-K log-probs) of a
  causal LM: the actor, SFT, DPO.
* :class:`ValueHead` — one value per response token ``[b, R]`` of a one-output token-classification
  model (the critic): the value of the state before each response token.
* :class:`ScoreHead` — one score per row ``[b]`` of the same model layout, read at each row's last
  valid token (the reward model; :func:`~hybrid_rl.workers.forward.sequence_scores`).

A head names the batch keys its forward reads (:attr:`Head.inputs`; never handed to the objective),
the ``meta_info`` keys it needs, the mask the learner's global loss denominators count, and returns
a :class:`HeadOutput` whose fields fill :class:`~hybrid_rl.objectives.base.MicroBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import nn

from hybrid_rl.objectives.base import ForwardNeeds
from hybrid_rl.workers.forward import response_log_probs, response_values, sequence_scores
from hybrid_rl.workers.fsdp_utils import to_device
from hybrid_rl.workers.topk_forward import response_log_probs_with_topk

__all__ = ["ForwardOptions", "Head", "HeadOutput", "LogProbHead", "ScoreHead", "ValueHead"]

Groups = Optional[list[list[int]]]


@dataclass(frozen=True)
class ForwardOptions:
    """How the learner runs a forward (its settings, the same for every micro-batch)."""

    use_remove_padding: bool
    """Pack the valid tokens of a micro-batch into one sequence instead of running on padding."""
    device: torch.device
    """Where the micro-batch is computed (inputs are prepared on the host and moved)."""
    fused_head: bool = False
    """The LM head returns log-probs itself (:mod:`hybrid_rl.workers.fused_head`; log-prob head only)."""


@dataclass
class HeadOutput:
    """A head's outputs for one micro-batch (with gradient in an update)."""

    log_prob: Optional[torch.Tensor] = None
    """``[b, R]`` log-probs of the response tokens (:class:`LogProbHead`)."""
    entropy: Optional[torch.Tensor] = None
    """``[b, R]`` per-token entropies when :attr:`ForwardNeeds.entropy`."""
    topk_log_prob: Optional[torch.Tensor] = None
    """``[b, R, K]`` log-probs at ``batch[ForwardNeeds.topk_ids_key]`` when asked for."""
    scores: Optional[torch.Tensor] = None
    """A scalar head's outputs: ``[b, R]`` (:class:`ValueHead`) or ``[b]`` (:class:`ScoreHead`)."""


class Head:
    """The forward a learner runs; subclasses set the class attributes and :meth:`forward`."""

    name: ClassVar[str] = ""
    """A short name for messages."""
    inputs: ClassVar[tuple[str, ...]] = ()
    """Batch keys the forward reads (kept from the objective's view of the batch)."""
    meta_keys: ClassVar[tuple[str, ...]] = ()
    """``meta_info`` keys an update needs (``temperature`` for log-probs)."""
    shares_prompts: ClassVar[bool] = False
    """Rows sharing a prompt may run it once (the prefix grouper; needs ``responses``)."""
    mask_key: ClassVar[str] = "response_mask"
    """The ``[b, ...]`` mask whose tokens and non-empty rows are the global loss denominators."""

    def check_needs(self, needs: ForwardNeeds, objective: str) -> None:
        """ValueError when ``objective`` asks this forward for what it does not compute."""
        if needs.entropy or needs.topk_ids_key:
            raise ValueError(f"the {objective} objective needs entropies or top-K log-probs, which the {self.name} "
                             "head does not compute. Fix: train that objective with the log-prob head (the actor).")

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], groups: Groups, needs: ForwardNeeds,
                temperature: Optional[float], options: ForwardOptions, paired: bool = False) -> HeadOutput:
        """The outputs of one micro-batch (``batch`` on the host; ``paired``: rows ``2i``/``2i + 1`` are pairs)."""
        raise TypeError(f"{type(self).__name__} does not define forward; a head must return a HeadOutput")

    def scores(self, module: nn.Module, batch: dict[str, torch.Tensor], groups: Groups, options: ForwardOptions,
               paired: bool = False) -> torch.Tensor:
        """The scalar outputs of one micro-batch (no objective: scoring)."""
        out = self.forward(module, batch, groups, ForwardNeeds(), None, options, paired).scores
        if out is None:
            raise ValueError(f"the {self.name} head computes no scores. Fix: score with a value or score head.")
        return out


class LogProbHead(Head):
    """Log-probs (and entropies, top-K log-probs) of the response tokens under ``softmax(logits / T)``."""

    name = "log-prob"
    inputs = ("responses", "input_ids", "attention_mask", "position_ids")
    meta_keys = ("temperature",)
    shares_prompts = True

    def check_needs(self, needs: ForwardNeeds, objective: str) -> None:
        """Every :class:`ForwardNeeds` is computed here."""

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], groups: Groups, needs: ForwardNeeds,
                temperature: Optional[float], options: ForwardOptions, paired: bool = False) -> HeadOutput:
        if needs.topk_ids_key:  # the logits themselves are needed: no fused head
            log_prob, entropy, topk = response_log_probs_with_topk(
                module, batch, temperature, batch[needs.topk_ids_key], options.use_remove_padding,
                entropy_grad=needs.entropy_grad, groups=groups, device=options.device)
            return HeadOutput(log_prob, entropy, topk)
        log_prob, entropy = response_log_probs(module, batch, temperature, options.use_remove_padding,
                                               calculate_entropy=needs.entropy, entropy_grad=needs.entropy_grad,
                                               groups=groups, device=options.device, fused_head=options.fused_head)
        return HeadOutput(log_prob, entropy)


class ValueHead(Head):
    """Values ``[b, R]`` (float32): the model's one output at the column predicting each response token."""

    name = "value"
    inputs = ("responses", "input_ids", "attention_mask", "position_ids")
    shares_prompts = True

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], groups: Groups, needs: ForwardNeeds,
                temperature: Optional[float], options: ForwardOptions, paired: bool = False) -> HeadOutput:
        return HeadOutput(scores=response_values(module, batch, options.use_remove_padding, groups, options.device))


class ScoreHead(Head):
    """One score per row ``[b]`` (float32): the model's one output at the row's last valid token.

    A paired micro-batch of ``m`` pairs runs as one forward over its ``m`` chosen rows followed by
    its ``m`` rejected rows (the reward model's order), its scores returned in row order.
    """

    name = "score"
    inputs = ("input_ids", "attention_mask", "position_ids")
    mask_key = "attention_mask"

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], groups: Groups, needs: ForwardNeeds,
                temperature: Optional[float], options: ForwardOptions, paired: bool = False) -> HeadOutput:
        rows = {k: to_device(batch[k], options.device) for k in self.inputs}
        if paired:  # chosen rows first, then rejected ones
            rows = {k: torch.cat([v[0::2], v[1::2]]) for k, v in rows.items()}
        scores = sequence_scores(module, rows["input_ids"], rows["attention_mask"], rows["position_ids"],
                                 options.use_remove_padding)
        if paired:  # back to row order: chosen i -> row 2i, rejected i -> row 2i + 1
            scores = torch.stack(scores.chunk(2), dim=1).reshape(-1)
        return HeadOutput(scores=scores)
