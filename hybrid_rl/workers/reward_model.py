"""A scalar reward model on one data-parallel rank: the :class:`~hybrid_rl.workers.learner.Learner`
with the score head and the ``bradley_terry`` objective (no Ray inside).

The model is the critic's layout (veRL's reward model): a causal-LM backbone with a one-output
token-classification head, read at each sequence's last valid token
(:class:`~hybrid_rl.workers.heads.ScoreHead`). A pair batch has one row per pair (``chosen_*`` and
``rejected_*`` sequences, ``margin``; :mod:`hybrid_rl.data.reward_data`); :func:`interleave_pairs`
turns it into the learner's paired rows (row ``2i`` chosen, ``2i + 1`` rejected), which the learner
keeps together, and a micro-batch of ``m`` pairs runs as one forward over its ``2m`` sequences. The
loss of each micro-batch is divided by the pairs of the whole batch on all ranks, so micro-batch and
data-parallel splits give the gradient of the batch in one piece.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch import nn

from hybrid_rl.algorithms.reward_loss import preference_metrics
from hybrid_rl.data.reward_data import SIDES
from hybrid_rl.objectives.base import ForwardNeeds, MicroBatch, Objective
from hybrid_rl.objectives.preference import BradleyTerryObjective
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.heads import ScoreHead
from hybrid_rl.workers.learner import Learner

__all__ = ["DataParallelRewardModel", "StepPreferenceMetrics", "interleave_pairs"]

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")

PREFERENCE_METRICS = ("rm/accuracy", "rm/margin", "rm/chosen_mean", "rm/rejected_mean")
"""The names :func:`~hybrid_rl.algorithms.reward_loss.preference_metrics` reports."""


def interleave_pairs(data: DataProto, pad_token_id: int) -> DataProto:
    """The ``2B`` rows of a pair batch of ``B`` pairs: row ``2i`` pair ``i``'s chosen sequence, row
    ``2i + 1`` its rejected one, right-padded to the wider side (``pad_token_id`` in ``input_ids``, 0
    elsewhere); ``margin`` [B], when present, on both rows of its pair."""
    sides = [{k: data.batch[f"{side}_{k}"] for k in SEQUENCE_KEYS} for side in SIDES]
    width = max(side["input_ids"].shape[1] for side in sides)

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    rows = {k: torch.stack([widen(side[k], pad_token_id if k == "input_ids" else 0) for side in sides], dim=1)
            .reshape(2 * len(data), width) for k in SEQUENCE_KEYS}
    if "margin" in data.batch.keys():
        rows["margin"] = data.batch["margin"].repeat_interleave(2)
    return DataProto.from_dict(rows, meta_info=dict(data.meta_info))


class StepPreferenceMetrics(Objective):
    """A paired scalar-head objective (Bradley-Terry) whose preference metrics (``rm/accuracy``,
    ``rm/margin``, ``rm/chosen_mean``, ``rm/rejected_mean``) cover a whole mini-batch, reported once
    per optimizer step (the reward model's report), instead of once per micro-batch."""

    paired = True

    def __init__(self, inner: Objective):
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name
        self._scores: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def forward(self) -> ForwardNeeds:
        return self.inner.forward

    @property
    def summed(self) -> tuple[str, ...]:
        return self.inner.summed

    def required_keys(self, on_policy: bool = False) -> list[str]:
        return self.inner.required_keys(on_policy)

    def input_keys(self, present: Iterable[str], on_policy: bool = False) -> list[str]:
        return self.inner.input_keys(present, on_policy)

    def check_keys(self, present: Iterable[str], on_policy: bool = False, *, caller: str = "update") -> None:
        self.inner.check_keys(present, on_policy, caller=caller)

    def bind(self, context: dict[str, Any]) -> None:
        self._scores = []
        self.inner.bind(context)

    def describe(self) -> str:
        return self.inner.describe()

    def __call__(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = self.inner(mb)
        scores = mb.scores.detach()
        self._scores.append((scores[0::2].cpu(), scores[1::2].cpu()))
        return loss, {k: v for k, v in metrics.items() if k not in PREFERENCE_METRICS}

    def step_metrics(self) -> dict[str, float]:
        chosen, rejected = (torch.cat(side) for side in zip(*self._scores))
        self._scores = []
        return {**self.inner.step_metrics(), **preference_metrics(chosen, rejected)}


class DataParallelRewardModel:
    """Scores and pairwise updates of ``module`` on this rank's rows (a :class:`Learner` with the score head).

    Args:
        module: HF token-classification model with ``num_labels=1`` (FSDP2 or plain).
        optimizer: optimizer over its parameters (None: scoring only).
        micro_batch_pairs: pairs per forward/backward (sequences per forward when scoring).
        use_remove_padding: pack valid tokens instead of running on padding.
        grad_clip: max global gradient norm (None: no clipping).
        pad_token_id: id used to widen rows when chosen and rejected differ in width.
        device: where micro-batches are moved for compute.
        attn_implementation: the packed-attention kernel (with ``attn_key``).
        attn_key: the config key of ``attn_implementation``; None (default): the model keeps its attention.
    """

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 micro_batch_pairs: int = 4, use_remove_padding: bool = False, grad_clip: Optional[float] = 1.0,
                 pad_token_id: int = 0, device: torch.device | str = "cpu", attn_implementation: Optional[str] = None,
                 attn_key: Optional[str] = None):
        if micro_batch_pairs < 1:
            raise ValueError(f"micro_batch_pairs={micro_batch_pairs} must be >= 1")
        self.learner = Learner(module, optimizer, mini_batch_rows=2 * micro_batch_pairs,
                               micro_batch_rows=2 * micro_batch_pairs, grad_clip=grad_clip, use_prefix_grouper=False,
                               use_remove_padding=use_remove_padding, device=device,
                               attn_implementation=attn_implementation, role="reward_model", head=ScoreHead(),
                               attn_key=attn_key, learner_metrics=("grad_norm",))
        self.micro_batch_pairs = micro_batch_pairs
        self.pad_token_id = pad_token_id
        self.objective = StepPreferenceMetrics(BradleyTerryObjective())

    @property
    def module(self) -> nn.Module:
        """The reward model (the learner's ``module``)."""
        return self.learner.module

    @property
    def optimizer(self) -> Optional[torch.optim.Optimizer]:
        """Its optimizer (None: scoring only)."""
        return self.learner.optimizer

    @property
    def num_skipped_steps(self) -> int:
        """Optimizer steps skipped so far (non-finite gradient norm)."""
        return self.learner.num_skipped_steps

    @torch.no_grad()
    def compute_scores(self, data: DataProto, prefix: str = "") -> torch.Tensor:
        """Scores ``[B]`` (float32) of the sequences ``{prefix}input_ids`` etc."""
        rows = DataProto.from_dict({k: data.batch[prefix + k] for k in SEQUENCE_KEYS})
        return self.learner.compute_scores(rows, micro_batch_rows=self.micro_batch_pairs)

    @torch.no_grad()
    def compute_pair_scores(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen [B], rejected [B])`` scores of a pair batch."""
        scores = self.learner.compute_scores(interleave_pairs(data, self.pad_token_id),
                                             micro_batch_rows=2 * self.micro_batch_pairs, paired=True)
        return scores[0::2].contiguous(), scores[1::2].contiguous()

    def update(self, data: DataProto) -> dict[str, list[float]]:
        """One optimizer step on the Bradley-Terry loss of the pair batch ``data`` (``margin`` [B]
        is subtracted from each score difference): ``rm/loss``, ``rm/accuracy``, ``rm/margin``,
        ``rm/chosen_mean``, ``rm/rejected_mean``, ``rm/grad_norm``."""
        if self.learner.optimizer is None:
            raise ValueError("this reward model was built without an optimizer: it scores only")
        rows = interleave_pairs(data, self.pad_token_id)
        return self.learner.update(rows, self.objective, metric_prefix="rm", caller="update_reward_model",
                                   mini_batch_rows=len(rows))
