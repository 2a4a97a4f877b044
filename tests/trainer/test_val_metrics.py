"""veRL's best@k / worst@k / maj@k validation metrics (trainer/core/val_metrics.py): exact on hand-made
inputs, the bootstrap against full enumeration, and the val-core / val-aux split."""

import itertools

import numpy as np
import pytest

from hybrid_rl.trainer.core.val_metrics import best_worst_of, draw_sizes, majority_of, sample_metrics


def test_draw_sizes_are_verls():
    assert draw_sizes(2) == [2] and draw_sizes(4) == [2, 4] and draw_sizes(6) == [2, 4, 6]
    assert draw_sizes(8) == [2, 4, 8] and draw_sizes(5, start=1) == [1, 2, 4, 5]


def test_best_and_worst_of_two_draws_by_hand():
    # [0, 1], 2 draws: the best is 1 unless both draws are 0 (1/4): mean 3/4, std sqrt(3/16)
    assert best_worst_of([1.0, 0.0], 2) == pytest.approx((0.75, np.sqrt(3 / 16), 0.25, np.sqrt(3 / 16)))
    # ties need no care: [2, 2, 5], 3 draws: P(no 5) = (2/3)^3 = 8/27
    best, _, worst, _ = best_worst_of([2.0, 5.0, 2.0], 3)
    assert best == pytest.approx(5 - 3 * 8 / 27) and worst == pytest.approx(2 + 3 * (1 / 27))


@pytest.mark.parametrize("values, k", [([0.3, 1.0, 0.0, 0.7], 3), ([1.0, 1.0, 0.0], 2), ([0.5, 0.2], 4)])
def test_best_and_worst_match_the_enumeration_of_every_draw(values, k):
    draws = list(itertools.product(values, repeat=k))
    best, worst = [max(d) for d in draws], [min(d) for d in draws]
    assert best_worst_of(values, k) == pytest.approx((np.mean(best), np.std(best), np.mean(worst), np.std(worst)))


def _verl_majority(values, preds, k):
    """Every ordered draw of k, each scored by veRL's rule (most votes; ties: the first drawn answer;
    the value of that answer's first draw), averaged."""
    total, n = 0.0, len(values)
    for draw in itertools.product(range(n), repeat=k):
        by_answer: dict = {}
        for i in draw:
            by_answer.setdefault(preds[i], []).append(values[i])
        winner = max(by_answer, key=lambda a: len(by_answer[a]))
        total += by_answer[winner][0]
    return total / n ** k


@pytest.mark.parametrize("values, preds, k", [
    ([1.0, 1.0, 0.0, 0.0], ["A", "A", "B", "C"], 4),
    ([1.0, 0.0], ["A", "B"], 2),
    ([0.5, 1.0, 0.0, 0.2, 1.0], ["x", "y", "z", "z", "y"], 3),
])
def test_majority_bootstrap_converges_to_the_enumeration(values, preds, k):
    mean, _ = majority_of(values, preds, k, draws=200_000)
    assert mean == pytest.approx(_verl_majority(values, preds, k), abs=0.005)


def test_majority_is_seeded_and_a_unanimous_answer_is_its_value():
    assert majority_of([1.0, 0.0, 1.0], ["a", "b", "a"], 2) == majority_of([1.0, 0.0, 1.0], ["a", "b", "a"], 2)
    assert majority_of([0.4, 0.4, 0.4], ["7", "7", "7"], 3) == (pytest.approx(0.4), pytest.approx(0.0))


def test_keys_follow_verl_core_and_aux():
    sources, uids = ["s"] * 4 + ["t"] * 3, ["a", "a", "b", "b", "c", "c", "d"]
    reward = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    m = sample_metrics(sources, uids, {"reward": reward}, preds=["1", "2", "1", "1", "3", "3", "4"])
    # s: prompt a [1, 0] best@2 3/4, prompt b [1, 1] best 1 -> 7/8; t: only c has n > 1
    assert m["val-core/s/reward/best@2/mean"] == pytest.approx(0.875)
    assert m["val-aux/s/reward/worst@2/mean"] == pytest.approx(0.625)
    assert m["val-aux/s/reward/std@2"] == pytest.approx(0.25)
    assert "val-core/s/reward/maj@2/mean" in m and m["val-core/t/reward/best@2/mean"] == 0.0
    with_acc = sample_metrics(sources, uids, {"reward": reward, "acc": [bool(r) for r in reward]})
    assert "val-core/s/acc/best@2/mean" in with_acc and "val-aux/s/reward/best@2/mean" in with_acc
    assert with_acc["val-core/s/acc/mean@2"] == 0.75 and "val-core/s/reward/mean@2" not in with_acc  # summarize's
    assert with_acc["val-core/t/acc/mean@2"] == 0.0 and with_acc["val-aux/t/acc/mean@1"] == 1.0  # d: one sample
    assert not any("maj@" in key for key in with_acc)  # no answers, no majority vote


def test_a_missing_value_counts_zero_and_no_answer_votes():
    m = sample_metrics(["s"] * 4, ["a", "a", "b", "b"], {"reward": [1.0, 0.0, 1.0, 1.0], "note": ["x"] * 4,
                                                         "acc": [1, None, 1, 1]}, preds=["1", None, "2", "2"])
    assert not any("/note/" in key for key in m)  # no number anywhere: no variable
    # prompt a's acc [1, None] is [1, 0] (the failed row unsolved, as pass@k counts it): (3/4 + 1) / 2
    assert m["val-core/s/acc/best@2/mean"] == pytest.approx(0.875) and m["val-core/s/acc/mean@2"] == 0.75
    # no answer is a vote (veRL): prompt a's reward maj@2 is that of [1 ("1"), 0 (None)], 1/2 exactly
    a_alone = majority_of([1.0, 0.0], ["1", None], 2)[0]
    assert m["val-aux/s/reward/maj@2/mean"] == pytest.approx((a_alone + 1.0) / 2) and 0.4 < a_alone < 0.6


def test_the_headline_variable_is_chosen_per_source():
    m = sample_metrics(["s", "s", "t", "t"], ["a", "a", "b", "b"],
                       {"reward": [1.0, 0.0, 1.0, 0.0], "acc": [np.bool_(True), np.bool_(False), None, None]})
    assert m["val-core/s/acc/best@2/mean"] == 0.75 and m["val-aux/s/reward/best@2/mean"] == 0.75
    assert m["val-core/t/reward/best@2/mean"] == 0.75 and m["val-core/t/reward/best@2/std"] == pytest.approx(
        np.sqrt(3 / 16)) and not any("/t/acc/" in key for key in m)


def test_equal_answers_vote_together_as_dict_keys():
    # 1 and 1.0 are one answer (as veRL's dict keys them): every draw's majority is worth 1
    assert majority_of([1.0, 1.0, 0.0], [1, 1.0, "1"], 3) != majority_of([1.0, 1.0, 0.0], [1, 2, "1"], 3)
    assert majority_of([1.0, 1.0], [1, 1.0], 2) == (1.0, 0.0)
    assert majority_of([1.0, 0.0], [[1], [2]], 2)[0] == pytest.approx(0.5, abs=0.05)  # unhashable: by repr


def test_a_prompt_whose_samples_all_failed_counts_zero_as_its_reward_does():
    both_failed = sample_metrics(["s"] * 4, list("aabb"), {"reward": [0.0, 0.0, 1.0, 1.0], "acc": [None, None, 1, 1]})
    assert both_failed["val-core/s/acc/mean@2"] == 0.5 and both_failed["val-core/s/acc/best@2/mean"] == 0.5
    greedy = sample_metrics(["s"] * 3, list("abc"),
                            {"reward": [1.0, 0.0, 0.0], "acc": [1, 0, None], "big": [10**400] * 3})
    assert greedy == {"val-core/s/acc/mean@1": pytest.approx(1 / 3)}  # 10**400 is no number: no variable


def test_a_source_without_answers_gets_no_vote():
    m = sample_metrics(["s", "s", "t", "t"], list("aabb"), {"reward": [1.0, 0.0, 1.0, 0.0]}, ["1", "2", None, None])
    assert "val-core/s/reward/maj@2/mean" in m and not any("/t/reward/maj@" in key for key in m)
