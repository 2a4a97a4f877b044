"""Online DPO in the PPO loop: an actor objective whose rows come in pairs changes the step plan.

When ``actor_rollout_ref.actor.objective`` selects an objective the registry marks ``paired``
(:class:`~hybrid_rl.objectives.registry.ObjectiveInfo`; ``{name: dpo, beta: 0.1}``), a training step is::

    generate -> [compute_rm_score] -> compute_reward -> [filter_groups] -> build_pairs
    -> [compute_ref_log_prob] -> update_actor -> [validate] -> [save_checkpoint] -> log

``build_pairs`` ranks each prompt's rollout group by its sequence score (``token_level_scores.sum(-1)``)
and keeps best vs worst (:func:`hybrid_rl.data.online_pairs.best_worst_pairs`: ties and one-row groups
skipped and counted), interleaved as the objective reads them (rows ``2i`` chosen, ``2i+1`` rejected).
With several data-parallel ranks the pairs are trimmed to a multiple of the rank count (counted), so the
contiguous split of the dispatch gives every rank whole pairs. There is no old-log-prob pass, no
advantage and no critic: ``algorithm.adv_estimator`` is not used (the checks and notices are
:mod:`hybrid_rl.trainer.config.paired_checks`). The update takes one optimizer step
per epoch over all of the step's pairs (their number varies per step; :data:`ONE_OPTIMIZER_STEP`).
A step without pairs skips the reference pass and the update (``online_dpo/update_skipped``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid_rl.data.online_pairs import PairSelection, best_worst_pairs, interleave_pairs, online_pair_metrics
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.paired_checks import objective_needs_reference, paired_objective

__all__ = ["ONE_OPTIMIZER_STEP", "PairedStep", "build_pair_batch", "empty_ref_log_prob", "objective_needs_reference",
           "paired_objective", "trim_pairs"]

ONE_OPTIMIZER_STEP = "one_optimizer_step"
"""``meta_info`` flag of an ``update_actor`` batch: the actor takes one optimizer step per epoch over
every row it is given (one mini-batch), whatever ``actor.ppo_mini_batch_size`` says."""


def trim_pairs(selection: PairSelection, ranks: int) -> tuple[PairSelection, int]:
    """The first pairs of ``selection``, a multiple of ``ranks`` of them, and how many were dropped."""
    keep = len(selection) - len(selection) % max(1, ranks)
    dropped = len(selection) - keep
    if not dropped:
        return selection, 0
    trimmed = PairSelection(selection.chosen[:keep], selection.rejected[:keep], selection.num_groups,
                            selection.num_ties, selection.num_singletons)
    return trimmed, dropped


@dataclass
class PairedStep:
    """What ``build_pairs`` leaves for the rest of the step: the scored rollout (logged as a PPO step's
    batch) and the pair count."""

    rollout: DataProto
    """The step's whole scored rollout, ``token_level_rewards`` = ``token_level_scores`` (no in-reward KL)."""
    pairs: int
    """Pairs in the interleaved batch (after trimming)."""


def build_pair_batch(batch: DataProto, ranks: int) -> tuple[DataProto, PairedStep, dict[str, float]]:
    """``(pairs, rollout, metrics)``: the best-vs-worst pairs of each prompt group of the scored ``batch``
    interleaved (``2P`` rows, P a multiple of ``ranks``), the rollout for logging, and the
    ``online_dpo/*`` metrics (``pairs``, ``tie_groups``, ``score_margin``, ``trimmed_pairs``)."""
    scores = batch.batch["token_level_scores"].sum(-1)  # [B]
    selection, dropped = trim_pairs(best_worst_pairs(batch.non_tensor_batch["uid"], scores), ranks)
    metrics = online_pair_metrics(selection, scores)
    metrics["online_dpo/trimmed_pairs"] = float(dropped)
    pairs = interleave_pairs(batch, selection)
    rollout = DataProto(batch=batch.batch.clone(False), non_tensor_batch=dict(batch.non_tensor_batch),
                        meta_info=dict(batch.meta_info))
    rollout.batch["token_level_rewards"] = rollout.batch["token_level_scores"]
    return pairs, PairedStep(rollout, len(selection)), metrics


def empty_ref_log_prob(batch: DataProto) -> torch.Tensor:
    """``ref_log_prob`` of a batch without rows: ``[0, R]`` float32."""
    return torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
