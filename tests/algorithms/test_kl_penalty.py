"""KL estimators and controllers: exact values, aliases, clamps, checkpointing."""

import math

import pytest
import torch

from hybrid_rl.algorithms import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
)

LOGP = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)  # logp - ref = [0.5, -1]


@pytest.mark.parametrize(
    "names, expected",
    [
        (("kl", "k1"), [0.5, -1.0]),
        (("abs",), [0.5, 1.0]),
        (("mse", "k2"), [0.125, 0.5]),
        (("low_var_kl", "k3"), [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1]),
    ],
)
def test_kl_penalty_exact_values_and_aliases(names, expected):
    for name in names:
        assert kl_penalty(LOGP, REF, name)[0].tolist() == pytest.approx(expected, rel=1e-12)


def test_every_listed_type_is_handled():
    for name in KL_PENALTY_TYPES:
        assert kl_penalty(LOGP, REF, name).shape == LOGP.shape


def test_low_var_kl_is_clamped_and_nonnegative():
    big = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[30.0]]), "k3")
    assert big.item() == 10.0  # exp(20) - 21 clamped to 10
    tiny = kl_penalty(torch.tensor([[30.0]]), torch.tensor([[0.0]]), "k3")
    assert tiny.item() == 10.0  # log-ratio -30 clamped to -20: e^-20 + 19 > 10 -> 10
    rand = kl_penalty(torch.randn(50, 7), torch.randn(50, 7), "low_var_kl")
    assert (rand >= 0).all()


def test_unknown_kl_penalty_lists_valid():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "full")


def test_compute_rewards():
    scores = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    out = compute_rewards(scores, LOGP, REF, kl_ratio=0.1)
    assert out[0].tolist() == pytest.approx([-0.05, 1.1], rel=1e-12)


def test_fixed_controller():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_updates_and_checkpoints():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)  # error +0.5 clipped to +0.2 -> x1.02
    assert ctrl.value == pytest.approx(0.204, rel=1e-12)
    ctrl.update(current_kl=0.09, n_steps=50)  # error -0.1 -> x0.95
    assert ctrl.value == pytest.approx(0.204 * 0.95, rel=1e-12)
    restored = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value


def test_adaptive_controller_rejects_bad_config():
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 10)


def test_get_kl_controller():
    assert isinstance(get_kl_controller(type="fixed", kl_coef=0.3), FixedKLController)
    adaptive = get_kl_controller(type="adaptive", kl_coef=0.3, target_kl=0.2, horizon=5)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.3
    with pytest.raises(ValueError, match="adaptive"):
        get_kl_controller(type="pid")
