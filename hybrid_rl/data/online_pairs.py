"""Online DPO pairs: each prompt's rollout group ranked by its scores, best vs worst.

Within each group (the rows sharing a prompt ``uid``, groups in first-seen order) the highest-scored
row is ``chosen`` and the lowest-scored ``rejected``; equal scores are broken by the lowest row
index, so the selection is deterministic. A group whose best and worst tie (every score equal)
carries no preference and is skipped and counted (``num_ties``), as is a group of one row
(``num_singletons``). A score that is not finite (NaN, inf) is a ValueError naming the row: it
cannot be ranked, and a reward that fails should score 0.0, not NaN.

:func:`interleave_pairs` lays the pairs out as the DPO objective reads them (as the offline DPO
data, :mod:`hybrid_rl.data.dpo_data`): row ``2i`` pair ``i``'s chosen, row ``2i+1`` its rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from hybrid_rl.protocol import DataProto

__all__ = ["PairSelection", "best_worst_pairs", "interleave_pairs", "online_pair_metrics"]


@dataclass(frozen=True)
class PairSelection:
    """The pairs chosen from one batch of rollout groups (P pairs)."""

    chosen: torch.Tensor
    """``[P]`` long: the row index of each pair's preferred response (its group's best)."""
    rejected: torch.Tensor
    """``[P]`` long: the row index of each pair's dispreferred response (its group's worst)."""
    num_groups: int
    """Groups (distinct uids) in the batch, kept or not."""
    num_ties: int
    """Groups of two or more rows skipped because every score was equal."""
    num_singletons: int
    """Groups skipped because they hold one row."""

    def __len__(self) -> int:
        return int(self.chosen.numel())


def _groups(labels: np.ndarray) -> dict[Any, list[int]]:
    """Row indices per uid, uids in first-seen order."""
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(labels.tolist()):
        groups.setdefault(uid, []).append(row)
    return groups


def best_worst_pairs(uids: Any, scores: torch.Tensor) -> PairSelection:
    """Best vs worst row of each prompt group (see the module docstring).

    Args:
        uids: ``[B]`` group labels (``non_tensor_batch["uid"]``, an object array).
        scores: ``[B]`` one score per row (e.g. ``token_level_scores.sum(-1)``).
    """
    labels = np.asarray(uids, dtype=object).reshape(-1)  # [B]
    values = scores.detach().to(torch.float64).reshape(-1).cpu()  # [B]
    if len(labels) != values.numel():
        raise ValueError(f"best_worst_pairs: {len(labels)} uids for {values.numel()} scores; pass one uid and one "
                         "score per row")
    bad = torch.nonzero(~torch.isfinite(values)).flatten()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"online DPO: row {row} (uid {labels[row]!r}) has score {values[row].item()}, which cannot be "
                         "ranked. Fix: make the reward function return a finite number (0.0 for an answer it cannot "
                         "judge).")
    chosen, rejected, ties, singletons = [], [], 0, 0
    groups = _groups(labels)
    for rows in groups.values():
        if len(rows) == 1:
            singletons += 1
            continue
        group = values[rows]  # [n]
        best, worst = int(torch.argmax(group)), int(torch.argmin(group))  # first index of the max / min
        if group[best] == group[worst]:
            ties += 1
            continue
        chosen.append(rows[best])
        rejected.append(rows[worst])
    return PairSelection(torch.tensor(chosen, dtype=torch.long), torch.tensor(rejected, dtype=torch.long),
                         len(groups), ties, singletons)


def interleave_pairs(data: DataProto, selection: PairSelection) -> DataProto:
    """The rows ``[c0, r0, c1, r1, ...]`` of ``data`` (every batch and non-tensor key; 2P rows, none
    when no pair was selected)."""
    order = torch.stack([selection.chosen, selection.rejected], dim=1).reshape(-1)  # [2P]
    return data.select_idxs(order)


def online_pair_metrics(selection: PairSelection, scores: torch.Tensor) -> dict[str, float]:
    """``online_dpo/pairs`` (pairs kept), ``online_dpo/tie_groups`` (groups skipped for a tie) and
    ``online_dpo/score_margin`` (mean best - worst score over the kept pairs; 0.0 without pairs)."""
    values = scores.detach().to(torch.float64).reshape(-1).cpu()  # [B]
    margin = values[selection.chosen] - values[selection.rejected]  # [P]
    return {"online_dpo/pairs": float(len(selection)), "online_dpo/tie_groups": float(selection.num_ties),
            "online_dpo/score_margin": float(margin.mean()) if margin.numel() else 0.0}
