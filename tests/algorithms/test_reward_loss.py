"""Bradley-Terry loss and preference metrics on hand-computed inputs; micro-batch split invariance."""

import math

import pytest
import torch

from hybrid_rl.algorithms import bradley_terry_loss, preference_metrics


def test_hand_computed_loss_and_margin():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0])
    # -log sigmoid(2) = log(1 + e^-2); -log sigmoid(0) = log 2
    want = (math.log1p(math.exp(-2.0)) + math.log(2.0)) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(want, rel=1e-6)
    margin = torch.tensor([2.0, -1.0])  # diffs become 0 and 1
    want = (math.log(2.0) + math.log1p(math.exp(-1.0))) / 2
    assert bradley_terry_loss(chosen, rejected, margin).item() == pytest.approx(want, rel=1e-6)


def test_gradient_pushes_chosen_up_and_rejected_down():
    chosen, rejected = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    assert torch.allclose(chosen.grad, torch.full((3,), -0.5 / 3))  # d/dx -log sigmoid(x) at 0 = -1/2
    assert torch.allclose(rejected.grad, torch.full((3,), 0.5 / 3))


def test_micro_batches_with_the_global_denominator_add_up():
    torch.manual_seed(0)
    chosen, rejected = torch.randn(8), torch.randn(8)
    whole = bradley_terry_loss(chosen, rejected)
    parts = sum(bradley_terry_loss(chosen[i:i + 3], rejected[i:i + 3], num_pairs=8) for i in range(0, 8, 3))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_metrics_and_bad_shapes():
    m = preference_metrics(torch.tensor([1.0, 0.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, 2.0, 1.0]))
    assert m == {"rm/accuracy": 0.625, "rm/margin": 0.5, "rm/chosen_mean": 1.5, "rm/rejected_mean": 1.0}
    with pytest.raises(ValueError, match=r"must both be \[B\]"):
        bradley_terry_loss(torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="num_pairs=0"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), num_pairs=0)
