"""The ``nll`` objective: bit-for-bit today's ``sft`` policy loss for every ``loss_agg_mode`` (values and
gradients), a hand-computed case, micro-batch split invariance and its config error."""

import pytest
import torch

from hybrid_rl.algorithms.loss_agg import LOSS_AGG_MODES, global_batch_denominators
from hybrid_rl.algorithms.policy_loss import get_policy_loss_fn
from hybrid_rl.objectives import MicroBatch, build_objective, objective_info
from hybrid_rl.objectives.supervised import NLLConfig, NLLObjective


def _batch(rows=5, length=7, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, length, generator=gen) < 0.6).to(torch.int64)
    mask[2] = 0  # a fully masked row (DataProto padding) counts in no denominator
    log_prob = (-4 * torch.rand(rows, length, generator=gen)).to(dtype).requires_grad_()
    return log_prob, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("global_denominators", [False, True])
def test_nll_is_the_sft_policy_loss_bit_for_bit(mode, global_denominators):
    log_prob, mask = _batch(seed=LOSS_AGG_MODES.index(mode))
    agg = {}
    if global_denominators:  # as the actor passes them: float32 counts of a larger mini-batch
        agg = {k: v + 3.0 for k, v in global_batch_denominators(mask).items()}
    sft = get_policy_loss_fn("sft")
    expected = sft(torch.zeros_like(log_prob), log_prob, torch.zeros_like(log_prob), mask, loss_agg_mode=mode,
                   clip_ratio_low=0.2, clip_ratio_high=0.2, **agg)[0]
    expected_grad = torch.autograd.grad(expected, log_prob)[0]
    loss, metrics = build_objective("nll", {"loss_agg_mode": mode})(
        MicroBatch({"response_mask": mask}, log_prob, {"loss_agg_mode": "token-mean", **agg}))
    grad = torch.autograd.grad(loss, log_prob)[0]
    assert torch.equal(loss, expected) and torch.equal(grad, expected_grad)
    assert torch.equal(metrics["sft/loss"], expected.detach()) and not metrics["sft/loss"].requires_grad


def test_hand_computed_token_and_sequence_means():
    log_prob = torch.tensor([[-1.0, -3.0, -8.0], [-2.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    token_mean, _ = NLLObjective()(MicroBatch({"response_mask": mask}, log_prob, {}))
    assert token_mean.item() == pytest.approx((1 + 3 + 2) / 3)
    seq_mean, _ = NLLObjective(NLLConfig("seq-mean-token-mean"))(MicroBatch({"response_mask": mask}, log_prob, {}))
    assert seq_mean.item() == pytest.approx((2 + 2) / 2)
    # the global denominators of a mini-batch of 12 tokens / 4 sequences
    share, _ = NLLObjective()(MicroBatch({"response_mask": mask}, log_prob, {"global_batch_num_tokens": 12.0}))
    assert share.item() == pytest.approx(6 / 12)
    seq_sum, _ = NLLObjective(NLLConfig("seq-mean-token-sum"))(
        MicroBatch({"response_mask": mask}, log_prob, {"global_batch_num_seqs": 4.0}))
    assert seq_sum.item() == pytest.approx((4 + 2) / 4)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_split_invariance(mode):
    log_prob, mask = _batch(rows=6, dtype=torch.float64)
    agg = global_batch_denominators(mask)
    objective = NLLObjective(NLLConfig(mode))
    whole, _ = objective(MicroBatch({"response_mask": mask}, log_prob, agg))
    whole_grad = torch.autograd.grad(whole, log_prob)[0]
    parts = [objective(MicroBatch({"response_mask": mask[s]}, log_prob[s], agg))[0] for s in (slice(0, 4), slice(4, 6))]
    split_grad = torch.autograd.grad(parts[0] + parts[1], log_prob)[0]
    assert torch.allclose(parts[0] + parts[1], whole, rtol=1e-12) and torch.allclose(split_grad, whole_grad)


def test_declarations():
    objective = NLLObjective()
    assert objective.config.loss_agg_mode == "token-mean"
    assert objective.required_keys() == ["response_mask"] and objective.summed == ("sft/loss",)
    assert not objective_info("nll").paired and not objective_info("nll").needs_reference


def test_config_error_is_one_line():
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.objective.loss_agg_mode='mean' is not a loss "
                                         "aggregation mode; valid: .* Fix: pick one of them") as err:
        build_objective("nll", {"loss_agg_mode": "mean"})
    assert "\n" not in str(err.value)
