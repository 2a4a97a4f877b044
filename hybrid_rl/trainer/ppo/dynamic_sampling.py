"""DAPO's dynamic sampling for the PPO trainer: the named step ``filter_groups``.

After the rewards, the groups (responses to one prompt) whose ``algorithm.filter_groups.metric`` is
the same for every response are dropped; while fewer than ``data.train_batch_size`` prompts remain,
the next prompt batch of the training stream is generated and scored through the same named steps
(:meth:`~hybrid_rl.trainer.core.loop.TrainerCore.next_prompt_batch`, so the loader's saved position
counts them and a resume is exact), filtered, and appended. The batch is then cut to exactly
``train_batch_size`` groups (surplus groups are discarded, as in veRL). Past
``max_num_gen_batches`` generation batches the batch is completed with the most recently dropped
groups (zero GRPO advantage) instead of stopping the run.

Prompt batches are padded to their own longest prompt, so the rows of several generation batches
are left-padded to one prompt width before they are joined (:func:`join_scored_batches`).

Metrics: ``train/num_gen_batches`` (veRL's name), ``train/filter_groups/kept_frac`` (kept groups /
generated groups) and ``train/filter_groups/filled_groups``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from hybrid_rl.algorithms.dapo import informative_groups
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.ppo.ops import scorer_column, scorer_keys

__all__ = ["SEQUENCE_METRICS", "fill_with_informative_groups", "group_metric", "join_scored_batches"]

logger = logging.getLogger(__name__)

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward")
"""Metrics read from the batch's tensors; any other name is a key the scorer returns."""

LEFT_PADDED_KEYS = ("prompts", "input_ids", "attention_mask", "position_ids")
"""Tensors that start with the left-padded prompt (the prompt width P differs between prompt batches)."""


def join_scored_batches(batches: list[DataProto]) -> DataProto:
    """One batch of ``batches``' rows: prompts left-padded to the widest (mask 0, position 0 on the
    padding), and a scorer column some batch lacks (all its rows failed) filled with None."""
    def width(batch: DataProto) -> int:
        return batch.batch["prompts"].shape[-1] if "prompts" in batch.batch.keys() else 0

    widest = max(width(b) for b in batches)
    columns = sorted({k for b in batches for k in b.non_tensor_batch})
    for batch in batches:
        pad = widest - width(batch)
        for key in LEFT_PADDED_KEYS if pad else ():
            if key in batch.batch.keys():
                batch.batch[key] = F.pad(batch.batch[key], (pad, 0))
        for key in columns:
            batch.non_tensor_batch.setdefault(key, np.array([None] * len(batch), dtype=object))
    return DataProto.concat(batches)


def group_metric(batch: DataProto, metric: str) -> torch.Tensor:
    """``[B]`` the metric each response's group must vary in (see the module docstring)."""
    if metric in SEQUENCE_METRICS:
        key = "token_level_rewards" if metric == "seq_final_reward" and "token_level_rewards" in batch.batch.keys() \
            else "token_level_scores"
        return batch.batch[key].sum(-1)
    values = scorer_column(batch, metric)
    if values is None and metric in ("acc", "score"):  # a scorer returning a plain number: its score,
        values = scorer_column(batch, "score")  # before the overlong penalty when one was added
        if values is None:
            return batch.batch["token_level_scores"].sum(-1)
    if values is None:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r} is neither {SEQUENCE_METRICS} nor a key the "
                         f"scorer returns (its dict keys: {scorer_keys(batch)}); fix the metric or return it from "
                         "compute_score.")
    return values


def _split(batch: DataProto, metric: str) -> tuple[DataProto, DataProto, int]:
    """``(kept rows, dropped rows, kept groups)`` of ``batch`` (row order kept)."""
    keep = informative_groups(batch.non_tensor_batch["uid"], group_metric(batch, metric)).numpy()
    kept_uids = set(batch.non_tensor_batch["uid"][keep].tolist())
    return batch.select_idxs(np.nonzero(keep)[0]), batch.select_idxs(np.nonzero(~keep)[0]), len(kept_uids)


def fill_with_informative_groups(batch: DataProto, cfg: Any, n: int, train_batch_size: int,
                                 next_scored_batch: Callable[[], DataProto], metrics: dict[str, Any]) -> DataProto:
    """The step's batch of ``train_batch_size`` groups of ``n`` rows with a varying metric (module docstring).

    Args:
        batch: the scored rows of the step's first generation batch (groups contiguous by ``uid``).
        cfg: ``algorithm.filter_groups``.
        next_scored_batch: generates and scores the next prompt batch through the earlier named steps.
    """
    kept, dropped, groups = _split(batch, cfg.metric)
    generated, num_gen = len(batch) // n, 1
    while groups < train_batch_size and (cfg.max_num_gen_batches <= 0 or num_gen < cfg.max_num_gen_batches):
        more = next_scored_batch()
        more_kept, more_dropped, more_groups = _split(more, cfg.metric)
        kept, dropped = join_scored_batches([kept, more_kept]), join_scored_batches([dropped, more_dropped])
        groups, generated, num_gen = groups + more_groups, generated + len(more) // n, num_gen + 1
    filled = max(0, train_batch_size - groups)
    if filled:
        logger.warning("filter_groups: %d of %d groups after %d generation batches (max_num_gen_batches=%d); the "
                       "batch is completed with %d dropped groups", groups, train_batch_size, num_gen,
                       cfg.max_num_gen_batches, filled)
        kept = join_scored_batches([kept, dropped.select_idxs(np.arange(len(dropped) - filled * n, len(dropped)))])
    metrics.update({"train/num_gen_batches": num_gen, "train/filter_groups/kept_frac": groups / max(generated, 1),
                    "train/filter_groups/filled_groups": filled})
    return kept.select_idxs(np.arange(train_batch_size * n))
