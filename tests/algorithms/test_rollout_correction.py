"""Rollout correction: hand-computed weights, rejections and metrics; veRL's formulas on random inputs
(written out here from veRL's rollout_corr_helper.py); the losses with weights; bypass mode; split
invariance; presets and one-line refusals."""

import math

import pytest
import torch

from hybrid_rl.algorithms import compute_policy_loss_gspo, compute_policy_loss_vanilla, describe_policy_losses
from hybrid_rl.algorithms.rollout_correction import (ROLLOUT_CORRECTION_PRESETS, RolloutCorrectionConfig,
                                                     bypass_policy_loss, compute_rollout_correction,
                                                     offpolicy_metrics, parse_is_threshold, parse_rejection_specs,
                                                     rejection_mask, resolve_preset, rollout_is_weights)
from split_invariance import assert_split_invariant, partitions

F64 = torch.float64
E = math.e
# two rows, three tokens; row 1's last token is padding
OLD = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.5, 0.0]], dtype=F64)
RO = torch.tensor([[-0.5, -1.0, -1.0], [-0.5, -1.5, 3.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.int64)
# log_ratio = OLD - RO = [[0.5, 0, -1], [0, 1, (masked)]]


def _close(tensor, expected):
    return torch.allclose(tensor.double(), torch.tensor(expected, dtype=F64), atol=1e-12)


def test_token_is_truncates_and_masks_by_hand():
    w, m = rollout_is_weights(OLD, RO, MASK, "token", threshold=2.0)
    assert _close(w, [[min(E ** .5, 2), 1, E ** -1], [1, 2.0, 0]])  # e^1 truncated at 2
    # the metrics summarise the applied weights (veRL 0.9.1): max 2 after truncation, not e
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(1 / E)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # raw e > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # 1/e < 0.5
    w, m = rollout_is_weights(OLD, RO, MASK, "token", threshold="0.5_2.0")  # IcePop: zero outside [0.5, 2]
    assert _close(w, [[E ** .5, 1, 0], [1, 0, 0]])
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    assert not w.requires_grad


def test_sequence_is_is_the_product_over_the_sequence():
    w, m = rollout_is_weights(OLD, RO, MASK, "sequence", threshold=10.0)
    seq = [E ** (0.5 - 1), E ** 1]  # exp of each row's summed log-ratio
    assert _close(w, [[seq[0]] * 3, [seq[1], seq[1], 0]])
    assert m["rollout_is_max"] == pytest.approx(E) and m["rollout_is_min"] == pytest.approx(E ** -0.5)
    w, _ = rollout_is_weights(OLD, RO, MASK, "sequence", threshold=2.0)
    assert w[1, 0].item() == pytest.approx(2.0)


def test_batch_normalize_makes_the_mean_one():
    w, m = rollout_is_weights(OLD, RO, MASK, "token", threshold=2.0, batch_normalize=True)
    assert (w * MASK).sum().item() / MASK.sum().item() == pytest.approx(1.0)
    raw = torch.tensor([E ** .5, 1, 1 / E, 1, 2])
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(raw.mean().item())
    w, _ = rollout_is_weights(OLD, RO, MASK, "sequence", threshold=2.0, batch_normalize=True)
    assert w[:, 0].mean().item() == pytest.approx(1.0)  # over sequences


def test_rejection_criteria_by_hand():
    # k1 = -r: [[-.5, 0, 1], [0, -1]]; k2 = r^2/2: [[.125, 0, .5], [0, .5]]; k3 = e^r - 1 - r
    mask, m = rejection_mask(OLD, RO, MASK, parse_rejection_specs("token_k2", 0.2))
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0]] and mask.dtype == MASK.dtype
    assert m["rollout_rs_token_k2_max"] == pytest.approx(0.5) and m["rollout_rs_masked_fraction"] == pytest.approx(0.4)
    mask, _ = rejection_mask(OLD, RO, MASK, parse_rejection_specs("token_k1", "0.5_2.0"))  # -r in [log .5, log 2]
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    k3 = [[E ** .5 - 1.5, 0, E ** -1], [0, E - 2]]
    mask, m = rejection_mask(OLD, RO, MASK, parse_rejection_specs("seq_mean_k3", 0.2))
    means = [sum(k3[0]) / 3, sum(k3[1]) / 2]  # [0.172, 0.359]: row 1 rejected whole
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert m["rollout_rs_seq_mean_k3_mean"] == pytest.approx((3 * means[0] + 2 * means[1]) / 5)  # token-weighted
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    mask, _ = rejection_mask(OLD, RO, MASK, parse_rejection_specs("seq_sum_k1,seq_max_k2", "1.5,0.4"))
    # seq_sum_k1: row0 -(-.5) = .5 in [log 1/1.5, log 1.5]? no (.5 > .405) -> rejected; row1 -1 -> rejected
    assert mask.tolist() == [[0, 0, 0], [0, 0, 0]]


def test_offpolicy_metrics_by_hand():
    m = offpolicy_metrics(OLD, RO, MASK)
    tok_old, tok_ro = [[0, -1, -2], [-.5, -.5]], [[-.5, -1, -1], [-.5, -1.5]]
    train_log_ppl = [-sum(r) / len(r) for r in tok_old]
    rollout_log_ppl = [-sum(r) / len(r) for r in tok_ro]
    assert m["training_log_ppl"] == pytest.approx(sum(train_log_ppl) / 2)
    assert m["rollout_ppl"] == pytest.approx(sum(math.exp(v) for v in rollout_log_ppl) / 2)
    assert m["kl"] == pytest.approx((-.5 + 0 + 1 + 0 - 1) / 5)
    diffs = [a - b for a, b in zip(train_log_ppl, rollout_log_ppl)]
    assert m["log_ppl_diff"] == pytest.approx(sum(diffs) / 2) and m["ppl_ratio"] == pytest.approx(
        sum(math.exp(d) for d in diffs) / 2)


def _verl_reference(old, ro, mask, level, threshold):
    """veRL's token/sequence TIS written out from rollout_corr_helper.compute_rollout_correction_weights."""
    m = mask.to(old.dtype)
    log_ratio = old - ro
    if level == "token":
        w = torch.exp(torch.clamp(log_ratio, -20, 20))
    else:
        w = torch.exp(torch.clamp((log_ratio * m).sum(-1, keepdim=True), -20, 20)).expand_as(old)
    return (w * m).clamp(max=threshold)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_match_verls_formula_on_random_inputs(level):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=gen, dtype=F64) * 3
    ro = old + torch.randn(6, 9, generator=gen, dtype=F64) * 0.1
    mask = (torch.rand(6, 9, generator=gen) > 0.2).long()
    w, _ = rollout_is_weights(old, ro, mask, level, threshold=1.5)
    assert torch.allclose(w.double(), _verl_reference(old, ro, mask, level, 1.5).double(), atol=1e-6)


def test_vanilla_and_gspo_scale_each_tokens_loss_and_gradient_by_the_weights():
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 5, generator=gen, dtype=F64)
    adv = torch.randn(4, 5, generator=gen, dtype=F64)
    mask = torch.ones(4, 5)
    weights = torch.rand(4, 5, generator=gen, dtype=F64) * 2
    for fn in (compute_policy_loss_vanilla, compute_policy_loss_gspo):
        lp = (old + torch.randn(4, 5, generator=gen, dtype=F64) * 0.1).requires_grad_(True)
        weighted = fn(old, lp, adv, mask, rollout_is_weights=weights)[0]
        weighted.backward()
        grad_w = lp.grad.clone()
        # the same loss from per-token pieces: token-mean of w_t * loss_t, one token at a time
        lp.grad = None
        pieces = sum(fn(old, lp, adv, mask * (torch.arange(20).view(4, 5) == k), global_batch_num_tokens=20)[0]
                     * weights.flatten()[k] for k in range(20)) if fn is compute_policy_loss_vanilla else None
        if pieces is not None:
            pieces.backward()
            assert weighted.item() == pytest.approx(pieces.item(), rel=1e-10)
            assert torch.allclose(grad_w, lp.grad, atol=1e-12)
        assert describe_policy_losses()[fn.__name__.rsplit("_", 1)[1]].applies_rollout_is_weights


def test_bypass_reinforce_and_ppo_clip():
    gen = torch.Generator().manual_seed(2)
    ro = -torch.rand(3, 4, generator=gen, dtype=F64)
    adv = torch.randn(3, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    lp = (ro + 0.05).requires_grad_(True)  # w = e^0.05 per token
    cfg = RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0)
    loss, clipfrac, ppo_kl, clipfrac_lower, metrics = bypass_policy_loss(compute_policy_loss_vanilla, lp, ro, adv,
                                                                         mask, cfg)
    m = mask.double()
    want = (-adv * lp.detach() * math.exp(0.05) * m).sum() / m.sum()
    assert loss.item() == pytest.approx(want.item(), rel=1e-10)
    assert clipfrac is None and clipfrac_lower is None  # reinforce clips nothing: veRL logs no clip fractions
    assert ppo_kl.item() == pytest.approx(-0.05) and metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        math.exp(0.05))
    loss.backward()
    assert torch.allclose(lp.grad, -adv * math.exp(0.05) * m / m.sum())  # the weight carries no gradient
    cfg = RolloutCorrectionConfig(bypass_mode=True, loss_type="ppo_clip", rollout_rs="token_k2", rollout_rs_threshold=1.0)
    out = bypass_policy_loss(compute_policy_loss_vanilla, lp, ro, adv, mask, cfg)
    ref = compute_policy_loss_vanilla(ro, lp, adv, mask)  # nothing rejected: PPO against pi_rollout
    assert out[0].item() == pytest.approx(ref[0].item(), rel=1e-12)


def test_bypass_reinforce_ppo_kl_counts_only_the_tokens_left_after_rejection():
    # log pi - log pi_rollout = [0.1, 0.1, 0.1, 2.0]: k2 = 0.5 * d^2 = [0.005] * 3 + [2.0]; at threshold 1
    # the last token is rejected. veRL: ppo_kl = mean(log pi_rollout - log pi) over the kept tokens = -0.1
    # (over all four it would be (-0.3 - 2.0) / 4 = -0.575); the loss averages the kept tokens only.
    ro = torch.tensor([[-1.0, -1.0, -1.0, -3.0]], dtype=F64)
    lp = (ro + torch.tensor([[0.1, 0.1, 0.1, 2.0]], dtype=F64)).requires_grad_(True)
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64)
    cfg = RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce", rollout_rs="token_k2",
                                  rollout_rs_threshold=1.0)
    loss, clipfrac, ppo_kl, clipfrac_lower, _ = bypass_policy_loss(compute_policy_loss_vanilla, lp, ro, adv,
                                                                   torch.ones(1, 4), cfg)
    assert ppo_kl.item() == pytest.approx(-0.1, rel=1e-6)
    assert loss.item() == pytest.approx(-(1 * -0.9 + 2 * -0.9 + 3 * -0.9) / 3, rel=1e-6)
    assert clipfrac is None and clipfrac_lower is None


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
def test_bypass_loss_is_split_invariant(loss_type):
    gen = torch.Generator().manual_seed(3)
    ro = -torch.rand(8, 6, generator=gen, dtype=F64)
    adv = torch.randn(8, 6, generator=gen, dtype=F64)
    mask = (torch.rand(8, 6, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    param = (ro + torch.randn(8, 6, generator=gen, dtype=F64) * 0.1).clone().requires_grad_(True)
    cfg = RolloutCorrectionConfig(bypass_mode=True, loss_type=loss_type, rollout_is="token", rollout_is_threshold=1.2)

    def loss_fn(rows, dens):
        return bypass_policy_loss(compute_policy_loss_vanilla, param[rows], ro[rows], adv[rows], mask[rows], cfg,
                                  **dens)[0]

    for layout in partitions(8):
        assert_split_invariant(loss_fn, param, mask, layout)


def test_compute_rollout_correction_combines_weights_and_rejections():
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2",
                                  rollout_rs_threshold=0.2)
    weights, mask, metrics = compute_rollout_correction(OLD, RO, MASK, cfg)
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0]] and weights.shape == OLD.shape
    assert {"rollout_corr/kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction"} <= set(metrics)
    weights, mask, metrics = compute_rollout_correction(OLD, RO, MASK, RolloutCorrectionConfig(preset="metrics"))
    assert weights is None and torch.equal(mask, MASK) and "rollout_corr/training_ppl" in metrics


def test_presets_parse_and_a_set_key_wins():
    for name in ROLLOUT_CORRECTION_PRESETS:
        cfg = resolve_preset(RolloutCorrectionConfig(preset=name))
        parse_is_threshold(cfg.rollout_is_threshold)
        parse_rejection_specs(cfg.rollout_rs, cfg.rollout_rs_threshold)
    cfg = resolve_preset(RolloutCorrectionConfig(preset="k3_rs_token_tis", rollout_rs_threshold=0.05))
    assert (cfg.rollout_is, cfg.rollout_rs, cfg.rollout_rs_threshold) == ("token", "seq_mean_k3", 0.05)


@pytest.mark.parametrize("options, thresholds, message", [
    ("token_k2", None, "needs algorithm.rollout_correction.rollout_rs_threshold"),
    ("token_k9", 1.0, "unknown criteria"),
    ("token_k1,token_k2", "1,2,3", "gives 3 values for 2 criteria"),
    ("seq_mean_k3", "0.1_0.2", "k2/k3 take one upper bound"),
    ("token_k1", "x", "is not a number"),
    ("seq_mean_k1", "1.001_0.999", "need lower <= upper"),
])
def test_malformed_rejection_settings_are_one_line(options, thresholds, message):
    with pytest.raises(ValueError, match=message):
        parse_rejection_specs(options, thresholds)
    with pytest.raises(ValueError, match="need 0 < lower <= upper"):
        parse_is_threshold("2.0_0.5")
    with pytest.raises(ValueError, match="is a boolean"):
        parse_is_threshold(True)
