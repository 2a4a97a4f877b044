"""The ``value`` objective (veRL's clipped value loss on a value head's [b, R] predictions): a hand-computed
case, the global denominators, its metrics, its config's errors and its registry entry."""

import pytest
import torch

from hybrid_rl.objectives import MicroBatch, build_objective, objective_info
from hybrid_rl.objectives.value import ValueConfig, ValueObjective


def _micro(vpreds, agg=None, **batch) -> MicroBatch:
    return MicroBatch(batch, None, agg or {"loss_agg_mode": "token-mean"}, scores=vpreds)


def _case(**agg) -> MicroBatch:
    # one row, two tokens: v = (1, 2), rollout values (0, 0), returns (2, 0), cliprange 0.5
    return _micro(torch.tensor([[1.0, 2.0]]), {"loss_agg_mode": "token-mean", **agg},
                  values=torch.zeros(1, 2), returns=torch.tensor([[2.0, 0.0]]), response_mask=torch.ones(1, 2))


def test_clipped_value_loss_by_hand():
    # clipped v = (0.5, 0.5); errors unclipped (1, 4), clipped (2.25, 0.25); max (2.25, 4)
    # loss = 0.5 * mean(2.25, 4) = 1.5625; the clipped error is the larger on token 0 only: clipfrac 0.5
    loss, metrics = ValueObjective(ValueConfig(cliprange_value=0.5))(_case())
    assert loss.item() == pytest.approx(1.5625)
    assert metrics["critic/vf_loss"].item() == pytest.approx(1.5625)
    assert metrics["critic/vf_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["critic/vpred_mean"].item() == pytest.approx(1.5)
    assert ValueObjective().summed == ("critic/vf_loss",)


def test_the_mini_batch_denominator_and_the_config_mode_are_used():
    # 8 tokens in the whole mini-batch: 0.5 * (2.25 + 4) / 8 = 0.390625
    loss, _ = ValueObjective(ValueConfig(cliprange_value=0.5))(_case(global_batch_num_tokens=torch.tensor(8.0)))
    assert loss.item() == pytest.approx(0.390625)
    # seq-mean-token-sum from the objective's own config: 0.5 * (2.25 + 4) / 1 sequence
    loss, _ = ValueObjective(ValueConfig(cliprange_value=0.5, loss_agg_mode="seq-mean-token-sum"))(_case())
    assert loss.item() == pytest.approx(3.125)


def test_gradient_flows_to_the_predictions():
    mb = _case()
    mb.scores.requires_grad_(True)
    loss, _ = ValueObjective()(mb)
    loss.backward()
    # token 0: max is the clipped error (clamp is flat there): 0; token 1: d/dv 0.5 * (v - 0)^2 / 2 = v / 2 = 1
    torch.testing.assert_close(mb.scores.grad, torch.tensor([[0.0, 1.0]]))


def test_a_scalar_head_without_per_token_values_is_refused():
    with pytest.raises(ValueError, match=r"one value per response token \(\[b, R\]\) from a value head, got \(1,\)"):
        ValueObjective()(_micro(torch.tensor([1.0])))


@pytest.mark.parametrize("settings, message", [
    ({"cliprange_value": 0}, r"^critic.cliprange_value must be a finite number > 0, got 0. Fix: set e.g. 0.5.$"),
    ({"cliprange_value": "x"}, r"^critic.cliprange_value must be a finite number > 0, got 'x'"),
    ({"loss_agg_mode": "mean"}, r"^critic.loss_agg_mode='mean' is not a loss aggregation mode; valid: "),
])
def test_config_errors_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        ValueConfig(**settings)


def test_registered_with_its_config():
    objective = build_objective("value", {"cliprange_value": 0.2, "loss_agg_mode": "seq-mean-token-mean"})
    assert isinstance(objective, ValueObjective) and objective.config.cliprange_value == 0.2
    assert not objective_info("value").paired
    assert objective.required_keys() == ["response_mask", "values", "returns"]
    with pytest.raises(ValueError, match="clip_range is not a setting of the value objective"):
        build_objective("value", {"clip_range": 0.2})
