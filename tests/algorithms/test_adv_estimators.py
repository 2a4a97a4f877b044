"""Advantage estimators: hand-computed values, per-sample loop references, registry and uniform call path."""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms import (
    ADV_ESTIMATOR_INPUTS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    group_ids,
    masked_mean,
    masked_var,
    masked_whiten,
    register_adv_est,
    registered_adv_estimators,
)
from hybrid_rl.algorithms import unregister_adv_est

F64 = torch.float64
BUILTINS = ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"]

# Outcome toy batch: group "a" scores [1, 0, 1], singleton group "b" score 2.
TOY_REWARDS = torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 1.0, 0], [0, 2.0, 0]], dtype=F64)
TOY_MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
TOY_INDEX = np.array(["a", "a", "a", "b"], dtype=object)


# ----------------------------------------------------------------------------- hand-computed values


def test_grpo_hand_values():
    adv, ret = compute_grpo_outcome_advantage(TOY_REWARDS, TOY_MASK, TOY_INDEX, epsilon=0.0)
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1]
    expected = [(1 / 3) / std, (-2 / 3) / std, (1 / 3) / std, 2.0]  # singleton: mean 0, std 1
    assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-12)
    assert torch.equal(adv, ret)
    assert adv[1, 2] == 0 and adv[3, 2] == 0  # zero outside the mask


def test_grpo_epsilon_and_dr_grpo():
    adv, _ = compute_grpo_outcome_advantage(TOY_REWARDS, TOY_MASK, TOY_INDEX)  # epsilon=1e-6
    assert adv[3, 0].item() == pytest.approx(2.0 / (1 + 1e-6), rel=1e-12)
    adv, _ = compute_grpo_outcome_advantage(TOY_REWARDS, TOY_MASK, TOY_INDEX, norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 2.0], rel=1e-12)


def test_grpo_identical_scores_give_zero():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(2, 2), np.array([7, 7]))
    assert torch.equal(adv, torch.zeros(2, 2))


def test_rloo_hand_values():
    adv, ret = compute_rloo_outcome_advantage(TOY_REWARDS, TOY_MASK, TOY_INDEX)
    # r_i - mean of the other two; singleton keeps its raw score
    assert adv[:, 0].tolist() == pytest.approx([0.5, -1.0, 0.5, 2.0], rel=1e-12)
    assert torch.equal(adv, ret) and adv[1, 2] == 0


def test_gae_hand_values_trailing_padding():
    rewards = torch.tensor([[0.0, 1.0, 0.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.2, 0.9]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=1: delta = 1 - 0.2 = 0.8; t=0: delta = 0.9*0.2 - 0.5 = -0.32, gae = -0.32 + 0.72*0.8 = 0.256
    raw = torch.tensor([[0.256, 0.8, 0.0]], dtype=F64)
    assert ret[0].tolist() == pytest.approx([0.756, 1.0, 0.9], rel=1e-12)
    assert torch.allclose(adv, masked_whiten(raw, mask))
    assert adv[0, :2].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-6)


def test_gae_skips_masked_middle_tokens():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64)
    mask = torch.tensor([[1, 0, 1, 1]])
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # raw advantages [0.9, 0.7 (carried), 0.7, 0.6]: token 0 bootstraps from token 2, not token 1
    assert (ret - values)[0].tolist() == pytest.approx([0.9, 0.7, 0.7, 0.6], rel=1e-12)


def test_reinforce_plus_plus_hand_values():
    rewards = torch.tensor([[0, 0, 1.0], [0, 2.0, 0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert ret.tolist() == [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]
    valid = [0.25, 0.5, 1.0, 1.0, 2.0]
    mean = sum(valid) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / 4 + 1e-8)
    assert adv[0].tolist() == pytest.approx([(v - mean) / std for v in (0.25, 0.5, 1.0)], rel=1e-7)  # masked_mean adds 1e-8 to counts
    assert adv[1, 2] == 0


def test_reinforce_plus_plus_multi_turn_carries_return_across_observations():
    # Row 0: two turns around a 2-token tool observation, outcome reward 1 at the end (veRL 0.9.1:
    # returns [1, 1, 0, 0, 1, 1]). Row 1: single turn, reward 2 on its last token, then padding.
    rewards = torch.tensor([[0, 0, 0, 0, 0, 1.0], [0, 0, 2.0, 0, 0, 0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    assert ret.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 0.0, 0.0, 0.0]]
    valid = [1.0] * 4 + [2.0] * 3
    mean = sum(valid) / 7
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / 6 + 1e-8)
    assert adv.tolist()[0] == pytest.approx([(1 - mean) / std] * 2 + [0, 0] + [(1 - mean) / std] * 2, rel=1e-7)
    assert adv.tolist()[1] == pytest.approx([(2 - mean) / std] * 3 + [0, 0, 0], rel=1e-7)


def test_reinforce_plus_plus_masked_positions_neither_discount_nor_add_reward():
    # gamma 0.5; position 1 is an observation carrying a stray reward 3: veRL drops it, gives it
    # return 0 and carries 0.5 (the return at t=2) to t=0 undiscounted: 0.5 * 0.5 = 0.25.
    rewards = torch.tensor([[0, 3.0, 0, 1.0]], dtype=F64)
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, torch.tensor([[1, 0, 1, 1]]), gamma=0.5)
    assert ret.tolist() == [[0.25, 0.0, 0.5, 1.0]]


def test_reinforce_plus_plus_baseline_hand_values():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 3.0], [5.0, 0.0]], dtype=F64)
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards, torch.ones(3, 2), np.array(["a", "a", "b"])
    )
    centred = [-1.0, 1.0, 5.0]  # group a mean 2; singleton b baseline 0
    tokens = [c for c in centred for _ in range(2)]
    mean = sum(tokens) / 6
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 5 + 1e-8)
    assert adv[:, 1].tolist() == pytest.approx([(c - mean) / std for c in centred], rel=1e-7)
    assert torch.equal(adv, ret)


def test_remax_hand_values():
    rewards = torch.tensor([[0, 1.0, 0], [0, 0, 2.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = compute_remax_outcome_advantage(rewards, torch.tensor([0.5, 3.0], dtype=F64), mask)
    assert ret.tolist() == [[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]]
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]]


# ----------------------------------------------------------------------------- loop references


def _random_batch(batch=40, length=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    holes = (torch.rand(batch, length, generator=gen) < 0.15) & (torch.arange(length)[None] > 0)
    mask_with_holes = mask * (~holes).long()  # multi-turn style masked tokens inside the response
    rewards = torch.randn(batch, length, generator=gen, dtype=F64) * mask
    values = torch.randn(batch, length, generator=gen, dtype=F64)
    # groups of sizes 1..5 in shuffled order, labelled by strings
    sizes = torch.randint(1, 6, (batch,), generator=gen).tolist()
    labels = [f"uid-{g}" for g, s in enumerate(sizes) for _ in range(s)][:batch]
    labels = np.array(labels, dtype=object)[torch.randperm(batch, generator=gen).numpy()]
    baselines = torch.randn(batch, generator=gen, dtype=F64)
    return rewards, mask, mask_with_holes, values, labels, baselines


def _ref_group_stats(scores, index):
    groups = defaultdict(list)
    for i in range(len(scores)):
        groups[index[i]].append(scores[i])
    return groups


def _ref_grpo(rewards, mask, index, eps, norm):
    scores = rewards.sum(-1).tolist()
    groups = _ref_group_stats(scores, index)
    out = torch.zeros_like(rewards)
    for i, s in enumerate(scores):
        g = groups[index[i]]
        if len(g) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(g) / len(g)
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        out[i] = ((s - mean) / (std + eps) if norm else s - mean) * mask[i]
    return out


def _ref_rloo(rewards, mask, index):
    scores = rewards.sum(-1).tolist()
    groups = _ref_group_stats(scores, index)
    out = torch.zeros_like(rewards)
    for i, s in enumerate(scores):
        g = groups[index[i]]
        adv = s if len(g) == 1 else s - (sum(g) - s) / (len(g) - 1)
        out[i] = adv * mask[i]
    return out


def _ref_whiten(x, mask):
    vals = [x[i, t].item() for i in range(x.shape[0]) for t in range(x.shape[1]) if mask[i, t]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return (x - mean) / math.sqrt(var + 1e-8)


def _ref_gae(rewards, values, mask, gamma, lam):
    batch, length = rewards.shape
    raw = torch.zeros_like(rewards)
    for i in range(batch):
        next_value, running = 0.0, 0.0
        for t in reversed(range(length)):
            if mask[i, t]:
                delta = rewards[i, t].item() + gamma * next_value - values[i, t].item()
                running = delta + gamma * lam * running
                next_value = values[i, t].item()
            raw[i, t] = running  # masked tokens carry the running GAE of the next valid token
    return _ref_whiten(raw, mask), raw + values


def _ref_reinforce_pp(rewards, mask, gamma):
    """veRL 0.9.1: a masked position gets return 0 and passes the running return through untouched."""
    returns = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[i, t]:
                running = rewards[i, t].item() + gamma * running
                returns[i, t] = running
    return _ref_whiten(returns, mask) * mask, returns


def _ref_reinforce_pp_baseline(rewards, mask, index):
    scores = rewards.sum(-1).tolist()
    groups = _ref_group_stats(scores, index)
    centred = torch.zeros_like(rewards)
    for i, s in enumerate(scores):
        g = groups[index[i]]
        centred[i] = (s - (0.0 if len(g) == 1 else sum(g) / len(g))) * mask[i]
    return _ref_whiten(centred, mask) * mask


def _ref_remax(rewards, mask, baselines):
    returns = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        total = 0.0
        for t in reversed(range(rewards.shape[1])):
            total += rewards[i, t].item() * mask[i, t].item()
            returns[i, t] = total
    return returns - baselines[:, None] * mask, returns


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop(seed, norm):
    rewards, mask, _, _, index, _ = _random_batch(seed=seed)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
    assert torch.allclose(adv, _ref_grpo(rewards, mask, index, 1e-6, norm), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_matches_loop(seed):
    rewards, mask, _, _, index, _ = _random_batch(seed=seed)
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    assert torch.allclose(adv, _ref_rloo(rewards, mask, index), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_loop(seed):
    rewards, _, mask, values, _, _ = _random_batch(seed=seed)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.95, lam=0.9)
    ref_adv, ref_ret = _ref_gae(rewards, values, mask, 0.95, 0.9)
    assert torch.allclose(ret, ref_ret, atol=1e-6, rtol=0)
    assert torch.allclose(adv, ref_adv, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("holes", [False, True])
def test_reinforce_plus_plus_matches_loop(seed, holes):
    rewards, mask, mask_with_holes, _, _, _ = _random_batch(seed=seed)
    mask = mask_with_holes if holes else mask
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    ref_adv, ref_ret = _ref_reinforce_pp(rewards, mask, 0.9)
    assert torch.allclose(ret, ref_ret, atol=1e-6, rtol=0)
    assert torch.allclose(adv, ref_adv, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_baseline_matches_loop(seed):
    rewards, mask, _, _, index, _ = _random_batch(seed=seed)
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    assert torch.allclose(adv, _ref_reinforce_pp_baseline(rewards, mask, index), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_remax_matches_loop(seed):
    rewards, mask, _, _, _, baselines = _random_batch(seed=seed)
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    ref_adv, ref_ret = _ref_remax(rewards, mask, baselines)
    assert torch.allclose(ret, ref_ret, atol=1e-6, rtol=0)
    assert torch.allclose(adv, ref_adv, atol=1e-6, rtol=0)


def test_float32_grpo_close_to_float64():
    rewards, mask, _, _, index, _ = _random_batch(seed=3)
    adv32, _ = compute_grpo_outcome_advantage(rewards.float(), mask, index)
    adv64, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert adv32.dtype == torch.float32
    assert torch.allclose(adv32.double(), adv64, atol=1e-5)


# ----------------------------------------------------------------------------- group ids


def test_group_ids_accepts_strings_ints_tensors_and_mixed_labels():
    ids, num = group_ids(np.array(["b", "a", "b"], dtype=object))
    assert num == 2 and ids[0] == ids[2] != ids[1]
    ids, num = group_ids(torch.tensor([5, 5, 9]))
    assert num == 2 and ids.tolist()[0] == ids.tolist()[1]
    ids, num = group_ids(np.array([1, "x", 1, None], dtype=object))  # unorderable -> first-seen order
    assert num == 3 and ids.tolist() == [0, 1, 0, 2]


# ----------------------------------------------------------------------------- registry & uniform call path


def _uniform_inputs():
    rewards, mask, _, values, index, baselines = _random_batch(batch=12, length=5, seed=4)
    return dict(
        token_level_rewards=rewards, response_mask=mask, values=values, index=index,
        reward_baselines=baselines, gamma=0.99, lam=0.95, norm_adv_by_std_in_grpo=True, epsilon=1e-6,
    )


def test_builtins_are_registered():
    assert set(BUILTINS) <= set(registered_adv_estimators())


@pytest.mark.parametrize("name", BUILTINS)
def test_every_estimator_takes_the_same_uniform_call(name):
    inputs = _uniform_inputs()
    adv, ret = compute_advantage(name, **inputs)
    direct_adv, _ = get_adv_estimator_fn(name)(**inputs)
    assert adv.shape == ret.shape == inputs["token_level_rewards"].shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv, direct_adv)


def test_dispatcher_fills_defaults():
    inputs = _uniform_inputs()
    adv, _ = compute_advantage("grpo", token_level_rewards=inputs["token_level_rewards"],
                               response_mask=inputs["response_mask"], index=inputs["index"])
    expected, _ = compute_grpo_outcome_advantage(inputs["token_level_rewards"], inputs["response_mask"], inputs["index"])
    assert torch.equal(adv, expected)
    assert ADV_ESTIMATOR_INPUTS["gamma"] == 1.0 and ADV_ESTIMATOR_INPUTS["lam"] == 1.0


@pytest.mark.parametrize(
    "name, missing, hint",
    [("gae", "values", "critic"), ("grpo", "index", "uid"), ("rloo", "index", "uid"),
     ("reinforce_plus_plus_baseline", "index", "uid"), ("remax", "reward_baselines", "greedy")],
)
def test_missing_required_input_names_the_fix(name, missing, hint):
    inputs = _uniform_inputs()
    inputs[missing] = None
    with pytest.raises(ValueError, match=hint) as err:
        compute_advantage(name, **inputs)
    assert missing in str(err.value)


def test_dispatcher_rejects_unknown_inputs_and_bad_shapes():
    inputs = _uniform_inputs()
    with pytest.raises(ValueError, match="norm_adv_by_std_in_gpro"):
        compute_advantage("grpo", norm_adv_by_std_in_gpro=False, **inputs)
    with pytest.raises(ValueError, match="response_mask"):
        compute_advantage("grpo", **{**inputs, "response_mask": inputs["response_mask"][:, :-1]})
    with pytest.raises(ValueError, match="index"):
        compute_advantage("grpo", **{**inputs, "index": inputs["index"][:-1]})
    with pytest.raises(ValueError, match="token_level_rewards"):
        compute_advantage("grpo", response_mask=inputs["response_mask"])


def test_unknown_estimator_lists_registered_names():
    with pytest.raises(ValueError, match="grpo") as err:
        get_adv_estimator_fn("grp0")
    assert "gae" in str(err.value) and "algorithm.adv_estimator" in str(err.value)


def test_duplicate_registration_rejected_and_custom_estimator_dispatches():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda **kw: None)
    try:
        @register_adv_est("test_only_score_minus_baseline")
        def _custom(token_level_rewards, response_mask, reward_baselines, **kwargs):
            adv = (token_level_rewards.sum(-1) - reward_baselines)[:, None] * response_mask
            return adv, adv

        inputs = _uniform_inputs()
        adv, _ = compute_advantage("test_only_score_minus_baseline", **inputs)
        assert torch.allclose(adv[:, 0], inputs["token_level_rewards"].sum(-1) - inputs["reward_baselines"])
    finally:
        unregister_adv_est("test_only_score_minus_baseline")
