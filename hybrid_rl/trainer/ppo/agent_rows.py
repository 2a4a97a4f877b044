"""The driver's side of several training rows per rollout (``actor_rollout_ref.rollout.agent.rows=every_call``).

A black-box agent's rollout (one input row: a prompt copy of ``rollout.n``) may come back from the
rollout as k rows (``rollout_row``: the input row, ``rollout_rows``: k). This module keeps the driver's
named steps as they are and adapts at three points (docs/agents.md, "Several rows per rollout"):

* ``generate``: the input rows are numbered before the call (:func:`number_rollouts`) and the input
  batch's other columns are repeated to the rollout's rows (:func:`expand_to_rollout_rows`);
* ``compute_advantage``: the estimator runs on one representative row per rollout and its advantage is
  shared by the rollout's rows, scaled by 1/k (:func:`hybrid_rl.algorithms.rollout_rows.broadcast_rollout_advantage`);
* ``update_actor``: the step's rows (a varying number) are one mini-batch per epoch, padded with rows whose
  ``response_mask`` is all 0 to a multiple of the data-parallel size (:func:`pad_for_update`); such rows
  add nothing to the loss, the gradient or the token / sequence denominators.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid_rl.protocol import DataProto, pad_dataproto_to_divisor

__all__ = ["ROLLOUT_ROW", "ROLLOUT_ROWS", "expand_to_rollout_rows", "has_rollout_rows", "number_rollouts",
           "pad_for_update", "rollout_ids"]

ROLLOUT_ROW = "rollout_row"
ROLLOUT_ROWS = "rollout_rows"


def number_rollouts(gen: DataProto) -> None:
    """Give each input row of a generate call its index in the call (``rollout_row``), in place."""
    column = np.empty(len(gen), dtype=object)
    column[:] = list(range(len(gen)))
    gen.non_tensor_batch[ROLLOUT_ROW] = column


def expand_to_rollout_rows(rest: DataProto, output: DataProto) -> DataProto:
    """``rest`` (the input rows' columns left on the driver) repeated to ``output``'s rows by their
    ``rollout_row``; ``rest`` itself when the rollout gave one row per input row in order."""
    if ROLLOUT_ROW not in output.non_tensor_batch:
        return rest
    origin = np.asarray(output.non_tensor_batch[ROLLOUT_ROW], dtype=np.int64)  # [B'] input row of each row
    if len(origin) == len(rest) and np.array_equal(origin, np.arange(len(rest))):
        return rest
    return rest.select_idxs(origin)


def has_rollout_rows(batch: DataProto) -> bool:
    """The batch's rows carry the rollout columns (``agent.rows=every_call``)."""
    return ROLLOUT_ROW in batch.non_tensor_batch


def rollout_ids(batch: DataProto) -> np.ndarray:
    """[B] a key per rollout, unique within the step: the prompt group (``uid``) and the input row."""
    uids = batch.non_tensor_batch["uid"]
    return np.asarray([f"{u}#{r}" for u, r in zip(uids, batch.non_tensor_batch[ROLLOUT_ROW])], dtype=object)


def pad_for_update(batch: DataProto, world_size: int) -> DataProto:
    """A copy of ``batch`` padded to a multiple of ``world_size`` rows (``pad_dataproto_to_divisor``: its
    leading rows repeated) whose padding rows have ``response_mask`` (and ``advantages``, ``returns``) all
    0, so each data-parallel rank gets as many rows and the padding adds nothing to any loss term or
    denominator."""
    padded, pad = pad_dataproto_to_divisor(batch, max(1, world_size))
    if pad == 0:
        return batch
    padded.meta_info = dict(batch.meta_info)
    for key in ("response_mask", "advantages", "returns"):
        if key in padded.batch.keys():
            padded.batch[key][-pad:] = 0
    return padded


def rollout_advantage_inputs(batch: DataProto) -> dict[str, Any]:
    """The rollout grouping :func:`broadcast_rollout_advantage` reads from the batch."""
    return {"index": batch.non_tensor_batch["uid"], "rollout": rollout_ids(batch)}
