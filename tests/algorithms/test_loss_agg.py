"""agg_loss: exact values per mode, edge cases, and micro-batch / rank split invariance."""

import pytest
import torch

from hybrid_rl.algorithms import LOSS_AGG_MODES, agg_loss, global_batch_denominators
from split_invariance import assert_split_invariant, partitions

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # last row fully masked (e.g. a padding row)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 non-empty rows
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # (3 + 4) / R=3 / 2
    ],
)
def test_exact_values(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, rel=1e-12)


def test_explicit_denominators_and_scale_factor():
    assert agg_loss(LOSS, MASK, "token-mean", global_batch_num_tokens=14).item() == pytest.approx(0.5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_batch_num_seqs=7).item() == pytest.approx(1.0)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)
    assert agg_loss(LOSS, MASK, "token-mean", global_batch_num_tokens=torch.tensor(14.0)).item() == pytest.approx(0.5)


def test_global_batch_denominators_counts():
    dens = global_batch_denominators(MASK)
    assert dens["global_batch_num_tokens"].item() == 3
    assert dens["global_batch_num_seqs"].item() == 2


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_padding_batch_gives_zero_and_finite_grad(mode):
    loss_mat = LOSS.clone().requires_grad_(True)
    out = agg_loss(loss_mat, torch.zeros_like(MASK), mode)
    out.backward()
    assert out.item() == 0.0 and torch.equal(loss_mat.grad, torch.zeros_like(LOSS))


def test_bool_mask_and_float32():
    out = agg_loss(LOSS.float(), MASK.bool(), "token-mean")
    assert out.dtype == torch.float32 and out.item() == pytest.approx(7 / 3, rel=1e-6)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm") as err:
        agg_loss(LOSS, MASK, "token_mean")
    assert "token_mean" in str(err.value)


def test_negative_denominator_rejected():
    with pytest.raises(ValueError, match="global_batch_num_tokens"):
        agg_loss(LOSS, MASK, "token-mean", global_batch_num_tokens=-1)


def _random_problem(batch=10, length=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[3] = 0  # at least one empty row
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    x = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    theta = torch.randn(length, generator=gen, dtype=torch.float64).requires_grad_(True)
    return mask, x, theta


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_split_invariance_of_loss_and_gradient(mode):
    mask, x, theta = _random_problem()

    def loss_fn(rows, dens):
        loss_mat = torch.sin(x[rows] * theta) + x[rows] ** 2 * theta  # [b, R] depends on shared theta
        return agg_loss(loss_mat, mask[rows], mode, **dens)

    for layout in partitions(mask.shape[0]):
        assert_split_invariant(loss_fn, theta, mask, layout)


def test_split_check_detects_missing_global_denominators():
    """Negative control: with per-micro-batch (local) denominators the sum is not the batch loss."""
    mask, x, theta = _random_problem()

    def local_only(rows, dens):
        return agg_loss(torch.sin(x[rows] * theta), mask[rows], "token-mean")

    with pytest.raises(AssertionError):
        assert_split_invariant(local_only, theta, mask, partitions(mask.shape[0])[1])
