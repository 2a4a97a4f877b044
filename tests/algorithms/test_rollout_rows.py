"""broadcast_rollout_advantage (issue 57 item 2): a rollout's rows share its advantage scaled by 1/k, the
group baseline is over rollouts, never rows; values by hand, and the one-row case equals the estimator."""

import math

import pytest
import torch

from hybrid_rl.algorithms.advantage import compute_advantage
from hybrid_rl.algorithms.rollout_rows import broadcast_rollout_advantage


def _rows(scores, lengths, width=4):
    """Rewards on each row's last token, masks of the given lengths."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def test_many_rows_of_one_rollout_share_its_advantage_over_k_and_do_not_move_the_baseline():
    # prompt a: rollout r1 (one row, score 1), rollout r2 (three rows, score 0); prompt b: two one-row rollouts
    scores, lengths = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5], [2, 3, 1, 4, 2, 2]
    rewards, mask = _rows(scores, lengths)
    adv, ret = broadcast_rollout_advantage("grpo", rewards, mask, ["a", "a", "a", "a", "b", "b"],
                                           ["r1", "r2", "r2", "r2", "r3", "r4"], epsilon=1e-6)
    # group a's rollout scores [1, 0]: mean 0.5, unbiased std sqrt(0.5); r1 gets 0.5/sqrt(0.5), r2 -that/3
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = [a, -a / 3, -a / 3, -a / 3, 0.0, 0.0]
    for row, (value, n) in enumerate(zip(expected, lengths)):
        assert adv[row, :n].tolist() == pytest.approx([value] * n)
        assert adv[row, n:].abs().sum() == 0
    assert torch.equal(adv, ret)
    # over rows (what a plain GRPO call would do) group a's baseline would be 0.25: not what is trained
    plain, _ = compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask,
                                 index=["a"] * 4 + ["b"] * 2, epsilon=1e-6)
    assert plain[0, 0].item() != pytest.approx(a)


def test_one_row_per_rollout_is_the_estimator_bit_for_bit():
    torch.manual_seed(0)
    rewards, mask = _rows(torch.rand(6).tolist(), [1, 2, 3, 4, 2, 1])
    index = ["a", "a", "a", "b", "b", "b"]
    for name in ("grpo", "rloo"):
        mine, _ = broadcast_rollout_advantage(name, rewards, mask, index, list(range(6)))
        theirs, _ = compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=index)
        assert torch.equal(mine, theirs)


def test_an_estimator_with_per_token_advantages_is_refused_in_one_line():
    rewards, mask = _rows([1.0, 0.0], [3, 3])
    with pytest.raises(ValueError, match="adv_estimator=reinforce_plus_plus gives a row advantages that vary along"):
        broadcast_rollout_advantage("reinforce_plus_plus", rewards, mask, ["a", "a"], ["r1", "r2"], gamma=0.5)
