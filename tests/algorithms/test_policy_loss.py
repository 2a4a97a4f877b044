"""Policy losses: hand-computed values and gradients, registry, uniform signature, split invariance."""

import math

import pytest
import torch

from hybrid_rl.algorithms import (
    LOSS_AGG_MODES,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
    registered_policy_losses,
)
from split_invariance import assert_split_invariant, partitions

F64 = torch.float64

# ratios [1.5, 0.5, 1.0, 5.0] with advantages [+1, +1, -1, -1]:
#  t0 clipped to 1.2 -> -1.2 | t1 unclipped -> -0.5 | t2 -> 1.0 | t3 dual-clipped at c=3 -> 3.0
RATIOS = torch.tensor([[1.5, 0.5, 1.0, 5.0]], dtype=F64)
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
OLD = torch.zeros(1, 4, dtype=F64)
MASK = torch.ones(1, 4)


def test_vanilla_hand_values_and_gradient():
    log_prob = RATIOS.log().requires_grad_(True)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_vanilla(OLD, log_prob, ADV, MASK)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.0 + 3.0) / 4, rel=1e-12)
    assert clipfrac.item() == pytest.approx(0.25)
    assert clipfrac_lower.item() == pytest.approx(0.25)
    assert ppo_kl.item() == pytest.approx(-math.log(1.5 * 0.5 * 5.0) / 4, rel=1e-6)
    loss.backward()
    # d/dlogp of -A * r is -A * r (unclipped tokens only), / 4 tokens
    assert log_prob.grad[0].tolist() == pytest.approx([0.0, -0.125, 0.25, 0.0], abs=1e-12)


def test_vanilla_asymmetric_clip_and_mask():
    loss, *_ = compute_policy_loss_vanilla(OLD, RATIOS.log(), ADV, MASK, clip_ratio_high=0.28)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 1.0 + 3.0) / 4, rel=1e-12)
    masked = torch.tensor([[1, 1, 0, 0]])
    loss, clipfrac, _, lower = compute_policy_loss_vanilla(OLD, RATIOS.log(), ADV, masked)
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2, rel=1e-12)
    assert clipfrac.item() == pytest.approx(0.5) and lower.item() == 0.0


def test_vanilla_log_ratio_is_clamped():
    loss, _, ppo_kl, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 1), torch.full((1, 1), 30.0), -torch.ones(1, 1), torch.ones(1, 1)
    )
    assert ppo_kl.item() == -20.0  # clamped log-ratio
    assert loss.item() == pytest.approx(3.0)  # dual clip
    assert torch.isfinite(loss)


def test_vanilla_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(OLD, OLD, ADV, MASK, clip_ratio_c=1.0)


def test_compute_policy_loss_matches_vanilla():
    log_prob = RATIOS.log()
    ours = compute_policy_loss(OLD, log_prob, ADV, MASK, cliprange=0.2, cliprange_high=0.28)
    ref = compute_policy_loss_vanilla(OLD, log_prob, ADV, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
    seq = compute_policy_loss(OLD, log_prob, ADV, MASK, cliprange=0.2, loss_agg_mode="seq-mean-token-sum")
    assert seq[0].item() == pytest.approx(-1.2 - 0.5 + 1.0 + 3.0, rel=1e-12)
    with pytest.raises(ValueError, match="clip_ratio"):
        compute_policy_loss(OLD, log_prob, ADV, MASK)  # no cliprange at all


def test_gspo_hand_values():
    old = torch.zeros(2, 2, dtype=F64)
    log_prob = torch.tensor([[0.1, 0.3], [-0.5, 7.0]], dtype=F64)  # row 1 token 1 is padding
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    # s_0 = exp(0.2) = 1.221 -> clipped 1.2 -> -1.2 ; s_1 = exp(-0.5) = 0.607 -> clipped 0.8 -> +0.8
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_gspo(
        old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean"
    )
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, rel=1e-12)
    assert clipfrac.item() == pytest.approx(1.0)
    assert ppo_kl.item() == pytest.approx(-(0.1 + 0.3 - 0.5) / 3, rel=1e-6)
    assert lower.item() == 0.0


def test_gspo_gradient_is_sequence_ratio_times_token_gradient():
    old = torch.zeros(2, 3, dtype=F64)
    log_prob = torch.tensor([[0.01, -0.02, 0.03], [0.02, 0.0, 0.5]], dtype=F64).requires_grad_(True)
    adv = torch.tensor([[2.0], [-1.0]], dtype=F64).expand(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, *_ = compute_policy_loss_gspo(old, log_prob, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    loss.backward()
    s = [math.exp(0.02 / 3), math.exp(0.02 / 2)]  # unclipped sequence ratios
    expected = [[-2.0 * s[0] / 5] * 3, [1.0 * s[1] / 5, 1.0 * s[1] / 5, 0.0]]  # token-mean over 5 tokens
    for got, want in zip(log_prob.grad.tolist(), expected):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------- registry / uniform signature


def test_builtins_registered_and_uniform_signature():
    assert {"vanilla", "gspo"} <= set(registered_policy_losses())
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4, 5, generator=gen)
    new = old + 0.1 * torch.randn(4, 5, generator=gen)
    adv = torch.randn(4, 5, generator=gen)
    mask = torch.ones(4, 5)
    for name in registered_policy_losses():
        out = get_policy_loss_fn(name)(
            old, new, adv, mask, loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28,
            clip_ratio_c=3.0, global_batch_num_tokens=None, global_batch_num_seqs=None, unused_extra=1,
            rollout_log_probs=old - 0.1,  # every loss accepts it; decoupled needs it
            dro_beta=0.1,  # dro's required setting
        )
        assert len(out) == 4 and all(t.dim() == 0 and torch.isfinite(t) for t in out)


def test_sft_loss_is_the_masked_negative_log_likelihood():
    log_prob = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, clipfrac, kl, lower = get_policy_loss_fn("sft")(torch.zeros(2, 2), log_prob, torch.randn(2, 2), mask)
    assert loss.item() == pytest.approx((1 + 2 + 3) / 3) and clipfrac == kl == lower == 0
    loss.backward()
    assert torch.equal(log_prob.grad, torch.tensor([[-1 / 3, -1 / 3], [-1 / 3, 0.0]]))
    seq = get_policy_loss_fn("sft")(None, log_prob.detach(), None, mask, loss_agg_mode="seq-mean-token-mean")[0]
    assert seq.item() == pytest.approx(((1 + 2) / 2 + 3) / 2)


def test_registry_errors():
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(compute_policy_loss_vanilla)
    with pytest.raises(ValueError, match="gspo") as err:
        get_policy_loss_fn("ppo")
    assert "vanilla" in str(err.value)


# ----------------------------------------------------------------------------- split invariance


@pytest.mark.parametrize("name", ["vanilla", "gspo", "decoupled", "sft"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_split_invariance(name, mode):
    gen = torch.Generator().manual_seed(1)
    batch, length = 10, 6
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[2] = 0
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    x = torch.randn(batch, length, generator=gen, dtype=F64)
    old = -torch.rand(batch, length, generator=gen, dtype=F64) * 3
    adv = torch.randn(batch, length, generator=gen, dtype=F64)
    theta = torch.randn(length, generator=gen, dtype=F64).requires_grad_(True)
    behaviour = old - torch.rand(batch, length, generator=gen, dtype=F64) * 2  # some weights exceed the cap
    fn = get_policy_loss_fn(name)
    clip = 0.2 if name == "vanilla" else 0.05

    def loss_fn(rows, dens):
        log_prob = old[rows] + 0.4 * torch.tanh(x[rows] * theta)  # some ratios clip, some do not
        return fn(old[rows], log_prob, adv[rows], mask[rows], loss_agg_mode=mode, clip_ratio_low=clip,
                  clip_ratio_high=clip, rollout_log_probs=behaviour[rows], behav_imp_weight_cap=4.0, **dens)[0]

    for layout in partitions(batch):
        assert_split_invariant(loss_fn, theta, mask, layout)


# ----------------------------------------------------------------------------- decoupled (AReaL)


def test_decoupled_hand_values_cap_and_gradient():
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=F64)
    log_prob = torch.tensor([[-0.9, -1.2, -1.0]], dtype=F64, requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.0, -3.0]], dtype=F64)  # weights e^0.5, 1, e^2 (> cap 5: dropped)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=F64)
    mask = torch.ones(1, 3, dtype=F64)
    fn = get_policy_loss_fn("decoupled")
    loss, *_ = fn(old, log_prob, adv, mask, rollout_log_probs=behaviour, behav_imp_weight_cap=5.0)
    expected = (-math.exp(0.1) * math.exp(0.5) + math.exp(-0.2) * 1.0 + 0.0) / 3  # token-mean over 3 tokens
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    # d/dlogp of -A * ratio * w = -A * ratio * w (no clip active here); the dropped token gets none
    want = torch.tensor([[-math.exp(0.1) * math.exp(0.5), math.exp(-0.2), 0.0]], dtype=F64) / 3
    torch.testing.assert_close(log_prob.grad, want)


def test_decoupled_equals_vanilla_on_policy_and_needs_behaviour():
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 5, generator=gen, dtype=F64)
    new = old + 0.3 * torch.randn(4, 5, generator=gen, dtype=F64)
    adv, mask = torch.randn(4, 5, generator=gen, dtype=F64), torch.ones(4, 5, dtype=F64)
    vanilla = get_policy_loss_fn("vanilla")(old, new, adv, mask)
    decoupled = get_policy_loss_fn("decoupled")(old, new, adv, mask, rollout_log_probs=old.clone())
    for a, b in zip(vanilla, decoupled):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="set actor_rollout_ref.rollout.calculate_log_probs=true"):
        get_policy_loss_fn("decoupled")(old, new, adv, mask)
    with pytest.raises(ValueError, match="behav_imp_weight_cap=1.0 is invalid"):
        get_policy_loss_fn("decoupled")(old, new, adv, mask, rollout_log_probs=old, behav_imp_weight_cap=1.0)
