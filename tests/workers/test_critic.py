"""DataParallelPPOCritic: values vs a plain HF forward, loss decrease, micro-batch invariance."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.algorithms import compute_value_loss
from hybrid_rl.workers.builders import build_optimizer
from hybrid_rl.workers.config import CriticConfig, OptimConfig
from hybrid_rl.workers.critic import DataParallelPPOCritic
from hybrid_rl.workers.model_loader import load_value_model
from tests.workers.helpers import make_batch


@pytest.fixture(scope="module")
def value_model(tiny_model_dir):
    torch.manual_seed(0)
    return load_value_model(tiny_model_dir)


def _config(**overrides):
    kwargs = dict(ppo_mini_batch_size=8, rollout_n=1, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=8, grad_clip=None,
                  cliprange_value=0.5, optim=OptimConfig(lr=1e-3, weight_decay=0.0))
    kwargs.update(overrides)
    return CriticConfig(**kwargs)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_compute_values_match_hf_forward(value_model, remove_padding):
    data = make_batch()
    critic = DataParallelPPOCritic(_config(ppo_micro_batch_size_per_gpu=3), value_model,
                                   use_remove_padding=remove_padding)
    values = critic.compute_values(data)
    b = data.batch
    with torch.no_grad():
        out = value_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                          position_ids=b["position_ids"]).logits[..., 0]
    expected = out[:, -6:-1] * b["response_mask"]
    assert values.shape == (8, 5)
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=0)


def _batch_with_targets(model):
    data = make_batch()
    critic = DataParallelPPOCritic(_config(), model)
    data.batch["values"] = critic.compute_values(data)
    g = torch.Generator().manual_seed(3)
    data.batch["returns"] = torch.randn(8, 5, generator=g) * data.batch["response_mask"]
    return data


def _clipped_loss(model, data):
    vpreds = DataParallelPPOCritic(_config(), model).compute_values(data)
    loss, _ = compute_value_loss(vpreds, data.batch["returns"], data.batch["values"],
                                 data.batch["response_mask"], 0.5)
    return loss.item()


def test_update_critic_reduces_the_clipped_value_loss(value_model):
    model = copy.deepcopy(value_model)
    data = _batch_with_targets(model)
    config = _config()
    critic = DataParallelPPOCritic(config, model, build_optimizer(model, config.optim))
    before = _clipped_loss(model, data)
    history = [critic.update_critic(data) for _ in range(10)]
    after = _clipped_loss(model, data)
    assert after < 0.7 * before, (before, after)
    assert history[0]["critic/vf_loss"][0] == pytest.approx(before, abs=1e-5)
    for key in ("critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
        assert key in history[-1]
    assert history[-1]["critic/num_skipped_steps"] == [0]


def test_update_critic_is_micro_batch_invariant(value_model):
    data = _batch_with_targets(value_model)
    results = []
    for micro in (8, 1, 3):
        model = copy.deepcopy(value_model)
        critic = DataParallelPPOCritic(_config(ppo_micro_batch_size_per_gpu=micro), model,
                                       torch.optim.SGD(model.parameters(), lr=1e-2))
        critic.update_critic(data)
        results.append(model.state_dict())
    moved = max((results[0][k] - v).abs().max().item() for k, v in value_model.state_dict().items())
    assert moved > 1e-4
    for other in results[1:]:
        for name, value in results[0].items():
            torch.testing.assert_close(other[name], value, atol=1e-5, rtol=0, msg=name)


def test_update_critic_requires_returns(value_model):
    data = make_batch()
    data.batch["values"] = torch.zeros(8, 5)
    critic = DataParallelPPOCritic(_config(), value_model, torch.optim.SGD(value_model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="returns"):
        critic.update_critic(data)
