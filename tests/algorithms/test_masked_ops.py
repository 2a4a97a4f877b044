"""Exact values of the masked reductions on a hand-computed toy input."""

import math

import pytest
import torch

from hybrid_rl.algorithms import masked_mean, masked_sum, masked_var, masked_whiten

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # selects 1, 2, 4


def test_masked_sum_and_mean():
    assert masked_sum(VALUES, MASK).item() == 7.0
    assert masked_sum(VALUES, MASK, axis=-1).tolist() == [3.0, 4.0]
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3, rel=1e-12)
    assert masked_mean(VALUES, MASK, axis=-1).tolist() == pytest.approx([1.5, 4.0], rel=1e-12)


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


def test_masked_var_biased_and_unbiased():
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squared sum 42/9
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(14 / 9, rel=1e-9)
    assert masked_var(VALUES, MASK).item() == pytest.approx(7 / 3, rel=1e-9)


def test_masked_var_unbiased_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(VALUES, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_values():
    out = masked_whiten(VALUES, MASK)
    std = math.sqrt(7 / 3 + 1e-8)
    assert out[0, 0].item() == pytest.approx((1 - 7 / 3) / std, rel=1e-9)
    assert out[1, 0].item() == pytest.approx((4 - 7 / 3) / std, rel=1e-9)
    # unmasked positions are transformed too (veRL semantics), not zeroed
    assert out[1, 2].item() == pytest.approx((6 - 7 / 3) / std, rel=1e-9)
    assert masked_mean(out, MASK).item() == pytest.approx(0.0, abs=1e-9)
    assert masked_var(out, MASK).item() == pytest.approx(1.0, rel=1e-6)
    unshifted = masked_whiten(VALUES, MASK, shift_mean=False)
    assert torch.allclose(unshifted, out + 7 / 3)
