"""Online DPO pairs: best vs worst of each rollout group, ties and singletons skipped and counted,
the interleaved rows, the metrics; every expected value worked out by hand."""

import numpy as np
import pytest
import torch

from hybrid_rl.data.online_pairs import PairSelection, best_worst_pairs, interleave_pairs, online_pair_metrics
from hybrid_rl.protocol import DataProto


def _uids(*labels):
    out = np.empty(len(labels), dtype=object)
    out[:] = labels
    return out


def test_best_and_worst_of_each_group_ties_broken_by_the_lowest_row():
    # group "b" (rows 0, 2, 5, 7): best 1.0 at rows 2 and 7 -> 2; worst 0.0 at rows 0 and 5 -> 0
    # group "a" (rows 1, 3, 4, 6): best 0.5 at row 4; worst -1.0 at row 6
    uids = _uids("b", "a", "b", "a", "a", "b", "a", "b")
    scores = torch.tensor([0.0, 0.2, 1.0, 0.2, 0.5, 0.0, -1.0, 1.0])
    pairs = best_worst_pairs(uids, scores)
    assert pairs.chosen.tolist() == [2, 4] and pairs.rejected.tolist() == [0, 6]  # groups in first-seen order
    assert pairs.chosen.dtype == torch.long and len(pairs) == 2
    assert (pairs.num_groups, pairs.num_ties, pairs.num_singletons) == (2, 0, 0)


def test_tied_groups_and_singletons_are_skipped_and_counted():
    # "t": all 1.0 (tie); "s": one row (singleton); "k": 0.0, 1.0, 1.0, 0.0 -> chosen row 6, rejected row 5
    uids = _uids("t", "t", "s", "t", "t", "k", "k", "k", "k")
    scores = torch.tensor([1.0, 1.0, 0.7, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    pairs = best_worst_pairs(uids, scores)
    assert pairs.chosen.tolist() == [6] and pairs.rejected.tolist() == [5]
    assert (pairs.num_groups, pairs.num_ties, pairs.num_singletons) == (3, 1, 1)


def test_no_pair_at_all():
    pairs = best_worst_pairs(_uids("x", "x", "y"), torch.tensor([0.5, 0.5, 1.0]))
    assert len(pairs) == 0 and (pairs.num_groups, pairs.num_ties, pairs.num_singletons) == (2, 1, 1)
    assert online_pair_metrics(pairs, torch.tensor([0.5, 0.5, 1.0])) == {
        "online_dpo/pairs": 0.0, "online_dpo/tie_groups": 1.0, "online_dpo/score_margin": 0.0}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_score_that_cannot_be_ranked_names_the_row(bad):
    with pytest.raises(ValueError, match=rf"online DPO: row 2 \(uid 'q1'\) has score {bad}, which cannot be ranked"):
        best_worst_pairs(_uids("q0", "q0", "q1", "q1"), torch.tensor([0.0, 1.0, bad, 1.0]))


def test_one_uid_per_score():
    with pytest.raises(ValueError, match="3 uids for 2 scores"):
        best_worst_pairs(_uids("a", "a", "b"), torch.tensor([0.0, 1.0]))


def test_interleave_keeps_every_key_in_pair_order():
    data = DataProto.from_dict({"responses": torch.arange(12).view(6, 2), "scores": torch.arange(6.0)},
                               non_tensors={"uid": _uids("a", "a", "a", "b", "b", "b"),
                                            "data_source": _uids(*"uvwxyz")},
                               meta_info={"temperature": 1.0})
    selection = PairSelection(torch.tensor([2, 3]), torch.tensor([0, 5]), num_groups=2, num_ties=0, num_singletons=0)
    rows = interleave_pairs(data, selection)
    assert rows.batch["responses"].tolist() == [[4, 5], [0, 1], [6, 7], [10, 11]]  # c0 = 2, r0 = 0, c1 = 3, r1 = 5
    assert rows.batch["scores"].tolist() == [2.0, 0.0, 3.0, 5.0]
    assert list(rows.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    assert list(rows.non_tensor_batch["data_source"]) == ["w", "u", "x", "z"]
    assert rows.meta_info == {"temperature": 1.0}
    empty = interleave_pairs(data, PairSelection(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                                 2, 2, 0))
    assert len(empty) == 0 and set(empty.batch.keys()) == {"responses", "scores"}


def test_metrics_count_pairs_and_ties_and_average_the_margin():
    # "a": best 3.0 (row 1) - worst -1.0 (row 2) = 4.0; "b": 2.0 (row 4) - 1.0 (row 3) = 1.0; "c" ties
    uids = _uids("a", "a", "a", "b", "b", "c", "c")
    scores = torch.tensor([0.0, 3.0, -1.0, 1.0, 2.0, 0.25, 0.25])
    pairs = best_worst_pairs(uids, scores)
    assert online_pair_metrics(pairs, scores) == {"online_dpo/pairs": 2.0, "online_dpo/tie_groups": 1.0,
                                                  "online_dpo/score_margin": 2.5}
