"""veRL's other advantage estimators: hand-computed groups, veRL's loop formulas on random inputs
(written out from core_algos.py, 2026-08), registry metadata, the one-line refusals."""

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms import adv_estimator_info, compute_advantage
from hybrid_rl.algorithms.advantage_variants import UNSUPPORTED_ADV_ESTIMATORS

F64 = torch.float64


def _rewards(scores, width=3):
    """``[B, width]`` rewards whose rows sum to ``scores`` (the score on the first token)."""
    out = torch.zeros(len(scores), width, dtype=F64)
    out[:, 0] = torch.tensor(scores, dtype=F64)
    return out


def _run(name, scores, index, mask=None, **kw):
    rewards = _rewards(scores)
    mask = torch.ones_like(rewards) if mask is None else mask
    return compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=np.array(index), **kw)[0]


def test_grpo_passk_rewards_only_the_best_of_each_group():
    adv = _run("grpo_passk", [1.0, 0.0, 0.5, 2.0, 2.0, 1.0], ["a", "a", "a", "b", "b", "b"],
               norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0, 0, 0.0, 0, 0])  # a: 1 - 0.5 on the best; b: a tie, gap 0
    adv = _run("grpo_passk", [1.0, 0.0, 0.5], ["a"] * 3)
    assert adv[0, 0].item() == pytest.approx(0.5 / (torch.tensor([1.0, 0.0, 0.5]).std().item() + 1e-6))
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        _run("grpo_passk", [1.0, 0.0], ["a", "b"])


def test_opo_subtracts_the_length_weighted_group_mean():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=F64)
    adv = _run("opo", [1.0, 0.0, 4.0], ["a", "a", "b"], mask=mask)
    baseline = (3 * 1.0 + 1 * 0.0) / 4
    assert adv[:, 0].tolist() == pytest.approx([1 - baseline, -baseline, 4.0])  # b is a singleton: baseline 0
    assert adv[1, 1].item() == 0  # zero outside the mask


def test_gpg_scales_the_centred_score_by_the_share_of_nonzero_scores():
    adv = _run("gpg", [1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"])
    assert adv[:, 0].tolist() == pytest.approx([4 / 1 * 0.5, 4 / 1 * -0.5, 0, 0])


def test_rloo_vectorized_gives_singletons_zero():
    adv = _run("rloo_vectorized", [1.0, 0.0, 2.0, 5.0], ["a", "a", "a", "b"])
    mean = 1.0
    assert adv[:, 0].tolist() == pytest.approx([(1 - mean) * 1.5, (0 - mean) * 1.5, (2 - mean) * 1.5, 0.0])
    loop = _run("rloo", [1.0, 0.0, 2.0, 5.0], ["a", "a", "a", "b"])
    assert torch.allclose(adv[:3], loop[:3]) and loop[3, 0].item() == 5.0  # rloo keeps a singleton's score


def test_grpo_vectorized_is_grpo():
    args = ([0.3, 1.0, 0.0, 0.2, 0.9, 0.1], ["a", "a", "a", "b", "b", "b"])
    assert torch.equal(_run("grpo_vectorized", *args), _run("grpo", *args))


def test_grpo_vectorized_description_names_its_departure_without_std():
    # norm_adv_by_std_in_grpo=false: scores 1, 0, 2 (mean 1) give s - mean = [0, -1, 1]; veRL's trainer
    # would still divide by the std (1), so the description must not promise veRL's numbers unqualified.
    adv = _run("grpo_vectorized", [1.0, 0.0, 2.0], ["a"] * 3, norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == [0.0, -1.0, 1.0]
    description = adv_estimator_info("grpo_vectorized").description
    assert "the same numbers" not in description
    assert "norm_adv_by_std_in_grpo=false" in description and "Departures" in description


def _verl_gdpo(components, weights, index, mask):
    """veRL's gdpo written out: GRPO per component (loop), weighted sum, masked whiten (unbiased var)."""
    total = torch.zeros_like(mask)
    for w, s in zip(weights, components):
        adv = torch.zeros(len(s), dtype=F64)
        for label in set(index):
            rows = [i for i, x in enumerate(index) if x == label]
            vals = s[rows]
            adv[rows] = (vals - vals.mean()) / (vals.std() + 1e-6) if len(rows) > 1 else vals
        total += w * adv.unsqueeze(-1) * mask
    m = mask
    mean = (total * m).sum() / m.sum()
    var = (((total - mean) ** 2) * m).sum() / m.sum() * (m.sum() / (m.sum() - 1))
    return (total - mean) * torch.rsqrt(var + 1e-8) * m


def test_gdpo_matches_verls_formula_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    index = [f"p{i // 4}" for i in range(12)]
    acc = (torch.rand(12, generator=gen) > 0.5).to(F64)
    fmt = torch.rand(12, generator=gen, dtype=F64)
    mask = (torch.rand(12, 5, generator=gen) > 0.3).to(F64)
    mask[:, 0] = 1
    ours = compute_advantage("gdpo", token_level_rewards=torch.zeros(12, 5, dtype=F64), response_mask=mask,
                             index=np.array(index), reward_components={"acc": acc, "format": fmt},
                             reward_weights=[1.0, 0.5])[0]
    want = _verl_gdpo([acc, fmt], [1.0, 0.5], index, mask)
    assert torch.allclose(ours.double(), want, atol=1e-5)
    with pytest.raises(ValueError, match="2 weights for 1 reward"):
        compute_advantage("gdpo", token_level_rewards=torch.zeros(12, 5), response_mask=mask, index=np.array(index),
                          reward_components={"acc": acc}, reward_weights=[1.0, 2.0])


def _verl_grpo_passk(scores, index, eps=1e-6):
    adv = torch.zeros_like(scores)
    for label in set(index):
        rows = [i for i, x in enumerate(index) if x == label]
        vals = scores[rows]
        top = torch.topk(vals, 2)
        adv[rows[int(top.indices[0])]] = (top.values[0] - top.values[1]) / (vals.std() + eps)
    return adv


def _verl_opo(scores, index, lengths):
    adv = torch.zeros_like(scores)
    for label in set(index):
        rows = [i for i, x in enumerate(index) if x == label]
        b = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum() if len(rows) > 1 else 0.0
        adv[rows] = scores[rows] - b
    return adv


@pytest.mark.parametrize("name", ["grpo_passk", "opo"])
def test_loops_written_from_verl_agree_on_random_inputs(name):
    gen = torch.Generator().manual_seed(1)
    index = [f"p{i % 5}" for i in range(20)]
    scores = torch.rand(20, generator=gen, dtype=F64)
    mask = torch.ones(20, 6, dtype=F64)
    mask[:, 3:] = (torch.rand(20, 3, generator=gen) > 0.5).to(F64)
    ours = compute_advantage(name, token_level_rewards=_rewards(scores.tolist(), 6), response_mask=mask,
                             index=np.array(index))[0][:, 0]
    want = _verl_grpo_passk(scores, index) if name == "grpo_passk" else _verl_opo(scores, index, mask.sum(-1))
    assert torch.allclose(ours, want, atol=1e-12)


def test_registry_metadata_and_refusals():
    for name in ("grpo_passk", "opo", "gpg", "gdpo", "rloo_vectorized", "grpo_vectorized"):
        assert adv_estimator_info(name).needs_groups, name
    assert adv_estimator_info("gdpo").requires == ("algorithm.gdpo_reward_keys",)
    assert set(UNSUPPORTED_ADV_ESTIMATORS) == {"optimal_token_baseline", "tir_optimal_token_baseline"}
    from hybrid_rl.trainer.config.checks import validate_config
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config

    with pytest.raises(ValueError, match="not available in hybrid_rl.*Nearest: algorithm.adv_estimator=grpo"):
        validate_config(to_ppo_config(get_config(["algorithm.adv_estimator=tir_optimal_token_baseline"])))
    with pytest.raises(ValueError, match="gdpo needs algorithm.gdpo_reward_keys set"):
        validate_config(to_ppo_config(get_config(["algorithm.adv_estimator=gdpo"])))
