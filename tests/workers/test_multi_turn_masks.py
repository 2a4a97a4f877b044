"""Multi-turn masks through the training math: observation tokens (response_mask 0, attention_mask 1)
are context for the forward but count nowhere in log-prob use, KL, entropy, loss aggregation or GAE.

Each check compares with a single-turn equivalent: the same quantity over the model tokens alone.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.algorithms.advantage import compute_gae_advantage_return
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, hf_response_log_probs, ppo_batch


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


def _with_observations(data):
    """Mark response positions 1 and 3 of every row with >= 5 valid tokens as observation tokens."""
    mask = data.batch["response_mask"].clone()
    long_rows = mask.sum(-1) >= 5
    mask[long_rows, 1] = 0
    mask[long_rows, 3] = 0
    data.batch["response_mask"] = mask  # attention_mask keeps them: they are context
    return data, (data.batch["attention_mask"][:, -mask.shape[1]:] - mask).bool()


def _update(model, data, **cfg):
    model = copy.deepcopy(model)
    config = actor_config(**cfg)
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=config.optim.lr))
    metrics = actor.update_policy(data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


@pytest.mark.parametrize("remove_padding", [False, True])
def test_log_probs_see_observations_as_context(base_model, remove_padding):
    data, obs = _with_observations(ppo_batch(base_model, response_len=7))
    assert obs.any()
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False, max_token_len=None)
    actor = DataParallelPPOActor(actor_config(), base_model, use_remove_padding=remove_padding)
    log_probs, _ = actor.compute_log_prob(data, calculate_entropy=True)
    expected = hf_response_log_probs(base_model, data, temperature=0.7)  # full sequence, observations included
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(log_probs[mask], expected[mask], atol=1e-5, rtol=0)


def test_loss_kl_entropy_ignore_whatever_sits_on_observations(base_model):
    data, obs = _with_observations(ppo_batch(base_model, response_len=7))
    common = dict(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.01)
    params, metrics = _update(base_model, data, **common)
    garbage = copy.deepcopy(data)
    for key in ("advantages", "old_log_probs", "ref_log_prob"):
        garbage.batch[key] = torch.where(obs, torch.full_like(garbage.batch[key], 37.0), garbage.batch[key])
    params_g, metrics_g = _update(base_model, garbage, **common)
    for name in params:
        torch.testing.assert_close(params[name], params_g[name], atol=1e-6, rtol=0, msg=name)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert metrics[key] == pytest.approx(metrics_g[key], rel=1e-5, abs=1e-7), key
    # micro-batch split invariance holds with holes in the mask too
    params_1, _ = _update(base_model, data, ppo_micro_batch_size_per_gpu=1, **common)
    for name in params:
        torch.testing.assert_close(params[name], params_1[name], atol=1e-5, rtol=0, msg=name)


def test_pg_loss_is_the_token_mean_over_model_tokens(base_model):
    data, _ = _with_observations(ppo_batch(base_model, response_len=7))
    _, metrics = _update(base_model, data)
    b = data.batch
    mask = b["response_mask"].bool()
    ratio = torch.exp(hf_response_log_probs(base_model, data, 0.7) - b["old_log_probs"])[mask]  # model tokens only
    adv = b["advantages"][mask]
    losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    losses = torch.where(adv < 0, torch.minimum(losses, -adv * 3.0), losses)
    assert metrics["actor/pg_loss"][0] == pytest.approx(losses.mean().item(), abs=1e-5)


def test_gae_over_a_trajectory_equals_gae_over_its_model_tokens():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0]], dtype=torch.float64)  # turns with observations
    rewards = torch.zeros(1, 10, dtype=torch.float64)
    rewards[0, 7] = 1.0  # the score on the last model token
    values = torch.randn(1, 10, generator=g, dtype=torch.float64)
    keep = mask[0].bool()
    raw_multi = _raw_gae(rewards, values, mask)
    raw_single = _raw_gae(rewards[:, keep], values[:, keep], torch.ones(1, int(keep.sum()), dtype=torch.float64))
    torch.testing.assert_close(raw_multi[:, keep], raw_single)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    adv_s, ret_s = compute_gae_advantage_return(rewards[:, keep], values[:, keep],
                                                torch.ones(1, int(keep.sum()), dtype=torch.float64), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv[:, keep], adv_s)
    torch.testing.assert_close(ret[:, keep], ret_s)


def _raw_gae(rewards, values, mask):
    """Returns - values from compute_gae (before whitening)."""
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    return returns - values
