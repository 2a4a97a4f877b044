"""The objective base: weighted composition (exact sums, weight-0 terms report only), key declarations,
the registry's config building and its one-line errors."""

from dataclasses import dataclass

import pytest
import torch

from hybrid_rl.objectives import (ForwardNeeds, MicroBatch, Objective, WeightedSum, build_objective,
                                  objective_info, register_objective, registered_objectives, unregister_objective)


class _Sum(Objective):
    reads = ("response_mask", "advantages")
    optional_reads = ("rollout_log_probs",)

    def __init__(self, scale: float, metric: str, entropy: bool = False):
        super().__init__(None)
        self.scale, self.metric, self.entropy = scale, metric, entropy

    @property
    def forward(self) -> ForwardNeeds:
        return ForwardNeeds(entropy=self.entropy, entropy_grad=self.entropy)

    @property
    def summed(self):
        return (self.metric,)

    def __call__(self, mb):
        value = self.scale * (mb.log_prob * mb.mask).sum()
        return value, {self.metric: value.detach()}


def _micro(on_policy=False, old=True):
    batch = {"response_mask": torch.tensor([[1.0, 1.0, 0.0]]), "advantages": torch.ones(1, 3)}
    if old:
        batch["old_log_probs"] = torch.full((1, 3), -1.0)
    return MicroBatch(batch, torch.tensor([[-0.5, -0.25, -9.0]], requires_grad=True), {}, on_policy=on_policy)


def test_weighted_sum_is_exact_and_zero_weights_only_report():
    mb = _micro()
    total = WeightedSum([(_Sum(1.0, "a"), 1.0), (_Sum(2.0, "b", entropy=True), -0.5), (_Sum(3.0, "c"), 0.0)])
    loss, metrics = total(mb)
    a = (mb.log_prob * mb.mask).sum()
    assert loss.item() == (a + (-0.5) * (2.0 * a)).item()
    assert set(metrics) == {"a", "b", "c"} and metrics["c"].item() == 3.0 * a.item()
    assert total.summed == ("a", "b", "c")
    assert total.forward == ForwardNeeds(entropy=True, entropy_grad=True)
    loss.backward()
    assert torch.equal(mb.log_prob.grad, torch.tensor([[0.0, 0.0, 0.0]]))  # 1 - 0.5 * 2 = 0 on the kept tokens


def test_a_zero_weight_term_needs_no_entropy_gradient():
    total = WeightedSum([(_Sum(1.0, "a"), 1.0), (_Sum(1.0, "b", entropy=True), 0.0)])
    assert total.forward == ForwardNeeds(entropy=True, entropy_grad=False)


def test_all_zero_weights_refused():
    with pytest.raises(ValueError, match="weight 0"):
        WeightedSum([(_Sum(1.0, "a"), 0.0)])(_micro())


def test_keys_declared_and_checked():
    term = _Sum(1.0, "a")
    assert term.input_keys(["response_mask", "advantages", "rollout_log_probs", "x"]) == [
        "response_mask", "advantages", "rollout_log_probs"]
    with pytest.raises(ValueError, match=r"needs batch keys \['advantages'\]"):
        term.check_keys(["response_mask"])


def test_old_log_prob_detaches_only_on_policy():
    assert torch.equal(_micro(on_policy=True, old=False).old_log_prob, torch.tensor([[-0.5, -0.25, -9.0]]))
    assert not _micro(on_policy=True, old=False).old_log_prob.requires_grad
    with pytest.raises(ValueError, match="not on-policy"):
        _ = _micro(on_policy=False, old=False).old_log_prob


@dataclass
class _Cfg:
    """Settings of the test objective."""

    beta: float = 0.1
    """A weight."""


def test_registry_builds_the_config_and_names_unknown_keys():
    @register_objective("_test_objective", paired=True)
    class _Obj(Objective):
        """A test objective. It does nothing."""

        Config = _Cfg

    try:
        assert "_test_objective" in registered_objectives()
        assert objective_info("_test_objective").paired
        assert objective_info("_test_objective").description == "A test objective."
        built = build_objective("_test_objective", {"beta": 0.5})
        assert isinstance(built, _Obj) and built.config == _Cfg(beta=0.5) and built.name == "_test_objective"
        with pytest.raises(ValueError, match=r"objective\.betta is not a setting .* valid: \['beta'\]"):
            build_objective("_test_objective", {"betta": 0.5})
        with pytest.raises(ValueError, match="unknown objective 'nope'"):
            build_objective("nope")
    finally:
        unregister_objective("_test_objective")
