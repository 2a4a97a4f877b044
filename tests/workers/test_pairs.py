"""Paired objectives keep rows 2i (chosen) and 2i+1 (rejected) together: fixed and dynamic micro-batches,
shuffled mini-batches, and which objectives are paired (workers/batching.py, update_utils.py, learner.py)."""

import pytest
import torch

from hybrid_rl.objectives import Objective, WeightedSum, build_objective
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.batching import split_micro_batches
from hybrid_rl.workers.learner import objective_paired
from hybrid_rl.workers.update_utils import mini_batches

LENGTHS = [5, 1, 2, 6, 3, 3, 7, 1]
"""Valid tokens per row; pairs (0,1) (2,3) (4,5) (6,7) cost 6, 8, 6, 8 tokens."""


def _rows(lengths=LENGTHS) -> DataProto:
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return DataProto.from_dict({"attention_mask": mask, "input_ids": mask * 5,
                                "row": torch.arange(len(lengths))}, meta_info={"global_steps": 2})


def _groups(parts) -> list[list[int]]:
    return [p.batch["row"].tolist() for p in parts]


def test_dynamic_micro_batches_balance_whole_pairs():
    data = _rows()
    split = dict(micro_batch_size=None, use_dynamic_bsz=True, max_token_len=14, key="k")
    # rows alone: 28 tokens in 2 micro-batches of 14, LPT by hand: {0, 2, 3, 7} and {1, 4, 5, 6}
    # (ordered by their first row): pairs (0, 1) and (6, 7) are split
    single, _ = split_micro_batches(data, **split)
    assert _groups(single) == [[0, 2, 3, 7], [1, 4, 5, 6]]
    # pairs: costs 6, 8, 6, 8 -> LPT: pair 1 and pair 3 open the groups, pair 0 joins the first, pair 2 the second
    paired, order = split_micro_batches(data, **split, paired=True)
    assert _groups(paired) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert order == list(range(8))


def test_a_pair_longer_than_the_budget_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^k=7 is smaller than one \(chosen, rejected\) pair of 8 tokens"):
        split_micro_batches(_rows(), micro_batch_size=None, use_dynamic_bsz=True, max_token_len=7, key="k",
                            paired=True)


def test_fixed_micro_batches_must_hold_whole_pairs():
    parts, _ = split_micro_batches(_rows(), micro_batch_size=4, use_dynamic_bsz=False, max_token_len=None, key="k",
                                   paired=True)
    assert _groups(parts) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="a micro-batch is 3 rows. Fix: make it an even number of rows"):
        split_micro_batches(_rows(), micro_batch_size=3, use_dynamic_bsz=False, max_token_len=None, key="k",
                            paired=True)
    with pytest.raises(ValueError, match="the batch is 7 rows"):
        split_micro_batches(_rows(LENGTHS[:7]), micro_batch_size=2, use_dynamic_bsz=False, max_token_len=None,
                            key="k", paired=True)


def _pairs_intact(rows: list[int]) -> bool:
    return all(c % 2 == 0 and r == c + 1 for c, r in zip(rows[0::2], rows[1::2]))


def test_shuffled_mini_batches_move_whole_pairs():
    data = _rows()
    for epoch in range(3):
        minis = mini_batches(data, 4, shuffle=True, epoch=epoch, paired=True)
        rows = [r for group in _groups(minis) for r in group]
        assert [len(g) for g in _groups(minis)] == [4, 4]
        assert sorted(rows) == list(range(8)) and _pairs_intact(rows)
    orders = {tuple(r for g in _groups(mini_batches(data, 4, True, e, paired=True)) for r in g) for e in range(3)}
    assert len(orders) > 1  # the pairs are shuffled
    unpaired = [r for g in _groups(mini_batches(data, 4, True, 0)) for r in g]
    assert not _pairs_intact(unpaired)  # row shuffling alone would split them
    with pytest.raises(ValueError, match="a mini-batch is 3 rows"):
        mini_batches(data, 3, shuffle=False, epoch=0, paired=True)


class _Explicit(Objective):
    paired = True


def test_which_objectives_are_paired():
    assert objective_paired(build_objective("bradley_terry"))
    assert objective_paired(build_objective("dpo"))
    assert not objective_paired(build_objective("value"))
    assert objective_paired(WeightedSum([(build_objective("dpo"), 1.0)]))
    assert objective_paired(_Explicit())
    assert not objective_paired(Objective())


def test_the_learner_names_the_key_of_an_odd_micro_batch(tiny_model_dir):
    from hybrid_rl.workers.heads import ScoreHead
    from hybrid_rl.workers.learner import Learner
    from hybrid_rl.workers.model_loader import load_value_model

    model = load_value_model(tiny_model_dir)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.0), mini_batch_rows=8, micro_batch_rows=3,
                      head=ScoreHead(), attn_key=None, role="actor")
    rows = _rows()
    rows.batch["position_ids"] = rows.batch["attention_mask"].cumsum(-1) - 1
    with pytest.raises(ValueError, match=r"^a paired objective keeps rows 2i and 2i\+1 \(a chosen and a rejected "
                                         r"response\) together, but a micro-batch is 3 rows. Fix: make "
                                         r"actor.ppo_micro_batch_size_per_gpu even.$"):
        learner.update(rows, build_objective("bradley_terry"))
