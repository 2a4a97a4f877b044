"""Distillation losses (hybrid_rl.algorithms.distillation): each loss_mode and its gradient on
hand-computed inputs, the top-K form, the clamps, and both ways the loss trains the student."""

import math

import pytest
import torch

from hybrid_rl.algorithms.distillation import (describe_distillation_losses, distillation_loss_info,
                                               distillation_objective, distillation_token_loss, forward_kl_topk,
                                               register_distillation_loss, registered_distillation_losses,
                                               topk_log_probs, unregister_distillation_loss)

F64 = torch.float64
S = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)  # student log-probs of the sampled tokens
T = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=F64)  # the teacher's


def _value_and_grad(mode):
    s = S.clone().requires_grad_(True)
    loss = distillation_token_loss(mode, s, T)
    loss.sum().backward()
    return loss.detach(), s.grad


@pytest.mark.parametrize("mode,value,grad", [
    # d = s - t = [ln 2, -ln 2]
    ("k1", [math.log(2), -math.log(2)], [1.0, 1.0]),
    ("kl", [math.log(2), -math.log(2)], [1.0, 1.0]),
    ("abs", [math.log(2), math.log(2)], [1.0, -1.0]),
    ("k2", [0.5 * math.log(2) ** 2, 0.5 * math.log(2) ** 2], [math.log(2), -math.log(2)]),
    ("mse", [0.5 * math.log(2) ** 2, 0.5 * math.log(2) ** 2], [math.log(2), -math.log(2)]),
    # k3 = e^r - r - 1 with r = t - s = [-ln 2, ln 2]: [0.5 + ln2 - 1, 2 - ln2 - 1]; d/ds = 1 - e^r
    ("k3", [math.log(2) - 0.5, 1 - math.log(2)], [0.5, -1.0]),
    ("low_var_kl", [math.log(2) - 0.5, 1 - math.log(2)], [0.5, -1.0]),
])
def test_each_estimator_and_its_gradient_by_hand(mode, value, grad):
    loss, g = _value_and_grad(mode)
    assert loss[0].tolist() == pytest.approx(value, rel=1e-12)
    assert g[0].tolist() == pytest.approx(grad, rel=1e-12)


def test_forward_kl_topk_by_hand_and_its_gradient_through_the_student_logits():
    # teacher top-2 of 3 tokens: p = [0.5, 0.25] at ids [0, 2]; student logits give q = softmax([0, 0, ln 2])
    teacher = torch.tensor([[[math.log(0.5), math.log(0.25)]]], dtype=F64)
    ids = torch.tensor([[0, 2]])
    logits = torch.tensor([[0.0, 0.0, math.log(2)]], dtype=F64, requires_grad=True)  # q = [1/4, 1/4, 1/2]
    q = topk_log_probs(logits, ids)
    assert q.exp().tolist()[0] == pytest.approx([0.25, 0.5], rel=1e-12)
    loss = forward_kl_topk(q.view(1, 1, 2), teacher)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5)  # = 0.25 ln 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.sum().backward()
    # dL/dz_j = -sum_k p_k (1[j = id_k] - q_j) = -p_j' + (sum_k p_k) q_j, with sum_k p_k = 0.75
    qs = [0.25, 0.25, 0.5]
    grad = [-0.5 + 0.75 * qs[0], 0.75 * qs[1], -0.25 + 0.75 * qs[2]]
    assert logits.grad[0].tolist() == pytest.approx(grad, rel=1e-12)


def test_topk_sum_below_zero_is_clamped_and_log_probs_clamp_from_below():
    teacher = torch.tensor([[[math.log(0.1)]]], dtype=F64)
    student = torch.tensor([[[math.log(0.9)]]], dtype=F64)  # 0.1 (ln 0.1 - ln 0.9) < 0
    assert forward_kl_topk(student, teacher).item() == 0.0
    tiny = torch.tensor([[[-50.0]]], dtype=F64)
    clamped = forward_kl_topk(tiny, torch.tensor([[[0.0]]], dtype=F64), log_prob_min_clamp=-10.0)
    assert clamped.item() == pytest.approx(10.0)  # e^0 (0 - (-10))


def test_loss_max_clamp_bounds_both_sides():
    s, t = torch.tensor([[0.0, -30.0]]), torch.tensor([[-30.0, 0.0]])
    assert distillation_token_loss("k1", s, t, loss_max_clamp=5.0).tolist() == [[5.0, -5.0]]


def test_direct_objective_is_the_aggregated_loss():
    losses = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = distillation_objective(losses, losses, losses, mask, use_policy_gradient=False,
                                           loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(2.0) and metrics == {}
    loss, _ = distillation_objective(losses, losses, losses, mask, use_policy_gradient=False,
                                     loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx((1.5 + 3.0) / 2)


def test_policy_gradient_objective_uses_minus_the_loss_as_advantage():
    losses = torch.tensor([[0.5, -1.0]])
    mask = torch.ones(1, 2)
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = distillation_objective(losses, log_prob, log_prob.detach(), mask, use_policy_gradient=True,
                                           loss_agg_mode="token-mean")
    # on-policy: ratio 1, pg loss = mean(-A * ratio) = mean(loss) = -0.25; d/dlog_prob = -A / 2 = loss / 2
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    assert log_prob.grad.tolist() == [[0.25, -0.5]]
    assert float(metrics["distillation/pg_clipfrac"]) == 0.0 and float(metrics["distillation/ppo_kl"]) == 0.0


def test_registry_describes_its_entries_and_takes_plugins():
    assert {"k1", "k3", "abs", "mse", "low_var_kl", "forward_kl_topk"} <= set(registered_distillation_losses())
    assert distillation_loss_info("forward_kl_topk").use_topk and not distillation_loss_info("k3").use_topk
    assert distillation_loss_info("k1").needs_policy_gradient and not distillation_loss_info("k3").needs_policy_gradient
    assert all(info.description for info in describe_distillation_losses().values())

    @register_distillation_loss("half_k1", needs_policy_gradient=True)
    def half_k1(student, teacher, **_):
        """Half the plain estimator."""
        return 0.5 * (student - teacher)

    try:
        assert distillation_token_loss("half_k1", S, T)[0].tolist() == pytest.approx([0.5 * math.log(2), -0.5 * math.log(2)])
        assert distillation_loss_info("half_k1").description == "Half the plain estimator."
        with pytest.raises(ValueError, match="already registered"):
            register_distillation_loss("half_k1")(half_k1)
    finally:
        unregister_distillation_loss("half_k1")
    with pytest.raises(ValueError, match="unknown distillation loss 'nope'.*distillation.distillation_loss.loss_mode"):
        distillation_token_loss("nope", S, T)
