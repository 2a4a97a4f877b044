"""The ``rollout_corr/*`` metrics equal veRL 0.9.1's formulas (``rollout_corr_helper.compute_is_metrics``,
``compute_rs_metrics``, ``compute_rollout_rejection_mask``, ``compute_offpolicy_metrics``), every expected
value worked out by hand below on one ragged batch with an empty row: truncated weights, masked (IcePop)
weights, sequence weights, token and sequence rejection criteria, the mismatch metrics."""

import math
import statistics

import pytest
import torch

from hybrid_rl.algorithms.rollout_correction import (RolloutCorrectionConfig, compute_rollout_correction,
                                                     offpolicy_metrics, parse_rejection_specs, rejection_mask,
                                                     rollout_is_weights)

F64 = torch.float64
LN = math.log
# row 0: two tokens (third is padding), row 1: three tokens, row 2: empty (all padding).
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.int64)
# log pi_train - log pi_rollout on the real tokens; padding holds garbage that must not count
R = [[LN(3), LN(1.5)], [LN(0.25), 0.0, LN(1.5)], []]
RO = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, -1.0, -1.5], [7.0, 7.0, 7.0]], dtype=F64)
OLD = RO + torch.tensor([[LN(3), LN(1.5), -9.0], [LN(0.25), 0.0, LN(1.5)], [-10.0, -10.0, -10.0]], dtype=F64)
APPROX = dict(rel=1e-7, abs=1e-9)  # veRL divides by count + 1e-8


def _masked_std(values):
    """veRL's std of the (clamped) weights or statistic: sqrt(E[x^2] - E[x]^2) over the tokens."""
    mean = sum(values) / len(values)
    return math.sqrt(max(sum(v * v for v in values) / len(values) - mean ** 2, 0.0))


def _check(metrics, expected):
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, **APPROX), name


def test_the_issues_example_summarises_the_applied_weights():
    """log-ratio [log 3, 0], TIS at 2: veRL 0.9.1 logs mean 1.5 and max 2.0 (the raw weights: 2.0, 3.0)."""
    old = torch.tensor([[LN(3), 0.0]], dtype=F64)
    _, m = rollout_is_weights(old, torch.zeros_like(old), torch.ones(1, 2), "token", threshold=2.0)
    assert m["rollout_is_mean"] == pytest.approx(1.5) and m["rollout_is_max"] == pytest.approx(2.0)


def test_token_truncated_weights_metrics_by_hand():
    w, m = rollout_is_weights(OLD, RO, MASK, "token", threshold=2.0)
    applied = [[2.0, 1.5], [0.25, 1.0, 1.5], []]  # raw [[3, 1.5], [0.25, 1, 1.5]]: 3 truncated at 2
    flat = [x for row in applied for x in row]
    mean = sum(flat) / 5  # 1.25
    seq = [1.75, 2.75 / 3, 0.0]  # each row's mean applied weight, the empty row's 0 included (veRL)
    _check(m, {"rollout_is_mean": mean, "rollout_is_max": 2.0, "rollout_is_min": 0.25,
               "rollout_is_ratio_fraction_high": 1 / 5, "rollout_is_ratio_fraction_low": 1 / 5,  # raw 3 > 2, 0.25 < .5
               "rollout_is_std": _masked_std(flat),
               "rollout_is_eff_sample_size": 1 / (sum((x / mean) ** 2 for x in flat) / 5),
               "rollout_is_seq_mean": sum(seq) / 3, "rollout_is_seq_std": statistics.stdev(seq),
               "rollout_is_seq_max": 1.75, "rollout_is_seq_min": 0.0, "rollout_is_seq_max_deviation": 1.0,
               # raw per-row means 2.25, 0.917, 0: one above 2, one (the empty row) below 1/2
               "rollout_is_seq_fraction_high": 1 / 3, "rollout_is_seq_fraction_low": 1 / 3})
    assert "rollout_is_oob_ratio" not in m and "rollout_is_masked_fraction" not in m
    assert w[0].tolist() == pytest.approx([2.0, 1.5, 0.0]) and w[2].tolist() == [0.0, 0.0, 0.0]


def test_token_masked_weights_metrics_by_hand():
    """IcePop ``0.5_2.0``: weights outside the bounds become 0 and the metrics see the zeros."""
    _, m = rollout_is_weights(OLD, RO, MASK, "token", threshold="0.5_2.0")
    flat = [0.0, 1.5, 0.0, 1.0, 1.5]  # raw 3 and 0.25 masked
    mean = sum(flat) / 5
    seq = [0.75, 2.5 / 3, 0.0]
    _check(m, {"rollout_is_mean": 0.8, "rollout_is_max": 1.5, "rollout_is_min": 0.0,
               "rollout_is_ratio_fraction_high": 1 / 5, "rollout_is_ratio_fraction_low": 1 / 5,
               "rollout_is_oob_ratio": 2 / 5, "rollout_is_std": _masked_std(flat),
               "rollout_is_eff_sample_size": 1 / (sum((x / mean) ** 2 for x in flat) / 5),
               "rollout_is_seq_mean": sum(seq) / 3, "rollout_is_seq_std": statistics.stdev(seq),
               "rollout_is_seq_max": 2.5 / 3, "rollout_is_seq_min": 0.0, "rollout_is_seq_max_deviation": 1.0,
               "rollout_is_seq_fraction_high": 1 / 3, "rollout_is_seq_fraction_low": 1 / 3})


def test_sequence_truncated_weights_metrics_by_hand():
    """Sequence weights: row 0's product 4.5 truncated at 2, row 1's 0.375; max/min and the ratio
    fractions come from the rows' summed log-ratios (the empty row's sum 0 counts), the mean is
    token-weighted over the applied weights."""
    w, m = rollout_is_weights(OLD, RO, MASK, "sequence", threshold=2.0)
    flat = [2.0, 2.0, 0.375, 0.375, 0.375]
    mean = sum(flat) / 5  # 1.025
    seq = [2.0, 0.375, 0.0]
    _check(m, {"rollout_is_mean": mean, "rollout_is_max": 4.5, "rollout_is_min": 0.375,
               "rollout_is_ratio_fraction_high": 1 / 3, "rollout_is_ratio_fraction_low": 1 / 3,
               "rollout_is_std": _masked_std(flat),
               "rollout_is_eff_sample_size": 1 / (sum((x / mean) ** 2 for x in flat) / 5),
               "rollout_is_seq_mean": sum(seq) / 3, "rollout_is_seq_std": statistics.stdev(seq),
               "rollout_is_seq_max": 2.0, "rollout_is_seq_min": 0.0, "rollout_is_seq_max_deviation": 1.0,
               "rollout_is_seq_fraction_high": 1 / 3, "rollout_is_seq_fraction_low": 2 / 3})  # raw 4.5 | .375, 0
    assert w[0].tolist() == pytest.approx([2.0, 2.0, 0.0]) and w[1].tolist() == pytest.approx([0.375] * 3)


def test_batch_norm_factor_is_the_applied_weights_mean():
    _, m = rollout_is_weights(OLD, RO, MASK, "token", threshold=2.0, batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.25) and m["rollout_is_mean"] == pytest.approx(1.25)
    _, m = rollout_is_weights(OLD, RO, MASK, "sequence", threshold=2.0, batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx((2.0 + 0.375) / 2)  # over the rows with tokens


def test_token_criterion_metrics_by_hand():
    mask, m = rejection_mask(OLD, RO, MASK, parse_rejection_specs("token_k2", 0.1))
    k2 = [[LN(3) ** 2 / 2, LN(1.5) ** 2 / 2], [LN(0.25) ** 2 / 2, 0.0, LN(1.5) ** 2 / 2]]
    flat = k2[0] + k2[1]
    seq = [sum(k2[0]) / 2, sum(k2[1]) / 3]  # token level: each row's mean, rows with tokens only
    assert mask.tolist() == [[0, 1, 0], [0, 1, 1], [0, 0, 0]]  # 0.603 and 0.961 > 0.1
    _check(m, {"rollout_rs_token_k2_mean": sum(flat) / 5, "rollout_rs_token_k2_max": max(flat),
               "rollout_rs_token_k2_min": 0.0, "rollout_rs_token_k2_fraction_high": 2 / 5,
               "rollout_rs_token_k2_fraction_low": 0.0,
               "rollout_rs_token_k2_std": _masked_std([min(x, .1) for x in flat]),
               "rollout_rs_token_k2_seq_mean": sum(seq) / 2, "rollout_rs_token_k2_seq_std": statistics.stdev(seq),
               "rollout_rs_token_k2_seq_max": max(seq), "rollout_rs_token_k2_seq_min": min(seq),
               "rollout_rs_token_k2_seq_max_deviation": max(seq), "rollout_rs_token_k2_seq_fraction_high": 1.0,
               "rollout_rs_token_k2_masked_fraction": 2 / 5, "rollout_rs_token_k2_seq_masked_fraction": 1.0,
               "rollout_rs_masked_fraction": 2 / 5, "rollout_rs_seq_masked_fraction": 2 / 3})  # over all 3 rows
    assert "rollout_rs_token_k2_seq_fraction_low" not in m  # veRL logs it for k1 criteria only


def test_sequence_criterion_metrics_by_hand():
    """seq_mean_k1 in [log .5, log 2]: row 0's mean -log(4.5)/2 = -0.75 is below; ``_mean`` weights each
    sequence by its tokens, ``_fraction_low`` counts sequences (1 of 2, not 2 tokens of 5)."""
    mask, m = rejection_mask(OLD, RO, MASK, parse_rejection_specs("seq_mean_k1", "0.5_2.0"))
    seq = [-LN(4.5) / 2, -LN(0.375) / 3]  # mean of k1 = -log-ratio per row
    low, high = LN(0.5), LN(2.0)
    clamped = [max(seq[0], low)] * 2 + [seq[1]] * 3
    assert mask.tolist() == [[0, 0, 0], [1, 1, 1], [0, 0, 0]]
    _check(m, {"rollout_rs_seq_mean_k1_mean": (2 * seq[0] + 3 * seq[1]) / 5, "rollout_rs_seq_mean_k1_max": seq[1],
               "rollout_rs_seq_mean_k1_min": seq[0], "rollout_rs_seq_mean_k1_fraction_high": 0.0,
               "rollout_rs_seq_mean_k1_fraction_low": 1 / 2, "rollout_rs_seq_mean_k1_std": _masked_std(clamped),
               "rollout_rs_seq_mean_k1_seq_mean": sum(seq) / 2, "rollout_rs_seq_mean_k1_seq_std": statistics.stdev(seq),
               "rollout_rs_seq_mean_k1_seq_max": seq[1], "rollout_rs_seq_mean_k1_seq_min": seq[0],
               "rollout_rs_seq_mean_k1_seq_max_deviation": -seq[0],
               "rollout_rs_seq_mean_k1_seq_fraction_high": 0.0, "rollout_rs_seq_mean_k1_seq_fraction_low": 1 / 2,
               "rollout_rs_seq_mean_k1_masked_fraction": 2 / 5, "rollout_rs_seq_mean_k1_seq_masked_fraction": 1 / 2,
               "rollout_rs_masked_fraction": 2 / 5, "rollout_rs_seq_masked_fraction": 1 / 3})
    assert high > seq[1] > low > seq[0]


def test_offpolicy_metrics_count_every_row_as_verl():
    m = offpolicy_metrics(OLD, RO, MASK)
    ro = [[-1.0, -2.0], [-0.5, -1.0, -1.5]]
    old = [[a + r for a, r in zip(ro_row, r_row)] for ro_row, r_row in zip(ro, R)]
    mean_train = [sum(row) / len(row) for row in old] + [0.0]  # the empty row's masked mean is 0
    mean_ro = [sum(row) / len(row) for row in ro] + [0.0]
    diff = [b - a for a, b in zip(mean_train, mean_ro)]
    flat_r = R[0] + R[1]
    _check(m, {"training_ppl": sum(math.exp(-v) for v in mean_train) / 3, "training_log_ppl": -sum(mean_train) / 3,
               "rollout_ppl": sum(math.exp(-v) for v in mean_ro) / 3, "rollout_log_ppl": -sum(mean_ro) / 3,
               "kl": -sum(flat_r) / 5, "k3_kl": sum(math.exp(r) - r - 1 for r in flat_r) / 5,
               "log_ppl_diff": sum(diff) / 3, "log_ppl_abs_diff": sum(abs(d) for d in diff) / 3,
               "log_ppl_diff_max": max(diff), "log_ppl_diff_min": min(diff),
               "ppl_ratio": sum(math.exp(d) for d in diff) / 3,
               "chi2_token": sum(math.exp(2 * r) for r in flat_r) / 5 - 1,
               "chi2_seq": (4.5 ** 2 + 0.375 ** 2 + 1.0) / 3 - 1})  # the empty row's product is 1


def test_compute_rollout_correction_logs_verls_names_with_the_prefix():
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_rs="seq_max_k3",
                                  rollout_rs_threshold=0.5)
    _, _, metrics = compute_rollout_correction(OLD, RO, MASK, cfg)
    for name in ("rollout_is_oob_ratio", "rollout_is_seq_max_deviation", "rollout_rs_seq_max_k3_seq_std",
                 "rollout_rs_seq_max_k3_std", "rollout_rs_seq_masked_fraction", "chi2_seq", "k3_kl"):
        assert f"rollout_corr/{name}" in metrics, name
    assert all(k.startswith("rollout_corr/") for k in metrics)
    assert "rollout_corr/rollout_is_masked_fraction" not in metrics
    # seq_max_k3: row 0's largest k3 is 3 - 1 - log 3 = 0.90 > 0.5, row 1's 0.25 - 1 - log .25 = 0.64 > 0.5
    assert metrics["rollout_corr/rollout_rs_seq_max_k3_max"] == pytest.approx(3 - 1 - LN(3))
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)
