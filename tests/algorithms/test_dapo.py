"""DAPO's reward-side pieces: the overlong ramp and the informative-group filter, by hand; the
driver's refill of a batch with informative groups (synthetic scored batches)."""

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms.dapo import informative_groups, overlong_penalty
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.schema import FilterGroupsConfig
from hybrid_rl.trainer.ppo.dynamic_sampling import fill_with_informative_groups, group_metric


def test_overlong_penalty_ramps_to_the_factor():
    lengths = torch.tensor([10, 12, 14, 16])  # max 16, ramp of 4 from 12
    assert overlong_penalty(lengths, 16, 4, 1.0).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])
    assert overlong_penalty(lengths, 16, 4, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5])
    with pytest.raises(ValueError, match="overlong_buffer.len=0"):
        overlong_penalty(lengths, 16, 0, 1.0)


def test_informative_groups_keep_varying_groups_and_singletons():
    uids = np.array(["a", "a", "b", "b", "c"], dtype=object)
    keep = informative_groups(uids, torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]))
    assert keep.tolist() == [True, True, False, False, True]


def _scored(prefix, accs, n=2):
    """A scored batch: one group per entry of ``accs`` (its n responses' accuracies)."""
    rows = [a for group in accs for a in group]
    uids = np.array([f"{prefix}-{g}" for g, group in enumerate(accs) for _ in group], dtype=object)
    scores = torch.zeros(len(rows), 3)
    scores[:, 0] = torch.tensor(rows, dtype=torch.float32)
    return DataProto.from_dict(tensors={"token_level_scores": scores}, non_tensors={"uid": uids})


def test_fill_keeps_generating_until_the_batch_is_full():
    later = iter([_scored("x", [[1, 1], [1, 0]]), _scored("y", [[0, 1], [0, 0]])])
    metrics = {}
    out = fill_with_informative_groups(_scored("s", [[1, 0], [0, 0]]), FilterGroupsConfig(enable=True, metric="acc"),
                                       n=2, train_batch_size=2, next_scored_batch=lambda: next(later), metrics=metrics)
    assert out.non_tensor_batch["uid"].tolist() == ["s-0", "s-0", "x-1", "x-1"]  # the first two informative groups
    assert metrics == {"train/num_gen_batches": 2, "train/filter_groups/kept_frac": 0.5,
                       "train/filter_groups/filled_groups": 0}
    assert group_metric(out, "seq_reward").tolist() == [1, 0, 1, 0]


def test_past_the_bound_the_batch_is_completed_with_dropped_groups():
    metrics = {}
    cfg = FilterGroupsConfig(enable=True, metric="seq_reward", max_num_gen_batches=2)
    later = iter([_scored("x", [[0, 0], [1, 1]])])
    out = fill_with_informative_groups(_scored("s", [[1, 0], [0, 0]]), cfg, n=2, train_batch_size=2,
                                       next_scored_batch=lambda: next(later), metrics=metrics)
    assert len(out) == 4 and out.non_tensor_batch["uid"].tolist()[:2] == ["s-0", "s-0"]
    assert metrics["train/num_gen_batches"] == 2 and metrics["train/filter_groups/filled_groups"] == 1
    with pytest.raises(ValueError, match="filter_groups.metric='nope' is neither"):
        group_metric(out, "nope")


def test_batches_of_different_prompt_widths_join_left_padded():
    """Prompt batches are padded to their own longest prompt: joining left-pads the narrower one, and a
    scorer column one batch lacks (every row failed) is filled with None, which counts as 0."""
    def batch(width, uid, extra):
        prompts = torch.full((2, width), 7)
        tensors = {"prompts": prompts, "input_ids": torch.cat([prompts, torch.ones(2, 3, dtype=torch.long)], 1),
                   "attention_mask": torch.ones(2, width + 3, dtype=torch.long),
                   "position_ids": torch.arange(width + 3).repeat(2, 1), "token_level_scores": torch.zeros(2, 3)}
        columns = {"uid": np.array([uid, uid], dtype=object), **extra}
        return DataProto.from_dict(tensors=tensors, non_tensors=columns)

    from hybrid_rl.trainer.ppo.dynamic_sampling import join_scored_batches
    from hybrid_rl.trainer.ppo.ops import scorer_column

    joined = join_scored_batches([batch(5, "a", {"reward_extra_acc": np.array([1.0, 0.0], dtype=object)}),
                                  batch(3, "b", {})])
    assert joined.batch["prompts"].shape == (4, 5) and joined.batch["input_ids"].shape == (4, 8)
    assert joined.batch["attention_mask"][2:, :2].sum() == 0 and joined.batch["input_ids"][2, 2].item() == 7
    assert scorer_column(joined, "acc").tolist() == [1.0, 0.0, 0.0, 0.0]
