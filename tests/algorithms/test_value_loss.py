"""Clipped value loss: hand-computed value and gradient, split invariance."""

import pytest
import torch

from hybrid_rl.algorithms import LOSS_AGG_MODES, compute_value_loss
from split_invariance import assert_split_invariant, partitions

F64 = torch.float64


def test_hand_values_and_gradient():
    vpreds = torch.tensor([[1.0, 2.0, 0.0]], dtype=F64, requires_grad=True)
    values = torch.tensor([[0.5, 2.0, 0.0]], dtype=F64)
    returns = torch.tensor([[2.0, 0.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: clip(1.0 -> 0.7): max((1-2)^2, (0.7-2)^2) = 1.69 (clipped); token 1: 4 both ways
    assert vf_loss.item() == pytest.approx(0.5 * (1.69 + 4.0) / 2, rel=1e-12)
    assert vf_clipfrac.item() == pytest.approx(0.5)
    vf_loss.backward()
    # token 0: the clipped prediction is constant in vpreds -> 0; token 1: 0.5 * 2*(2-0) / 2 tokens
    assert vpreds.grad[0].tolist() == pytest.approx([0.0, 1.0, 0.0], abs=1e-12)


def test_seq_mode_passes_through():
    vpreds = torch.tensor([[1.0, 3.0], [0.0, 0.0]], dtype=F64)
    returns = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    vf_loss, _ = compute_value_loss(vpreds, returns, vpreds, mask, 0.5, loss_agg_mode="seq-mean-token-sum")
    assert vf_loss.item() == pytest.approx(0.5 * (1.0 + 9.0 + 0.0) / 2)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_split_invariance(mode):
    gen = torch.Generator().manual_seed(2)
    batch, length = 10, 5
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    x = torch.randn(batch, length, generator=gen, dtype=F64)
    values = torch.randn(batch, length, generator=gen, dtype=F64)
    returns = torch.randn(batch, length, generator=gen, dtype=F64)
    theta = torch.randn(length, generator=gen, dtype=F64).requires_grad_(True)

    def loss_fn(rows, dens):
        vpreds = values[rows] + x[rows] * theta
        return compute_value_loss(vpreds, returns[rows], values[rows], mask[rows], 0.3, mode, **dens)[0]

    for layout in partitions(batch):
        assert_split_invariant(loss_fn, theta, mask, layout)
