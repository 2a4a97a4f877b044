"""The mode-neutral Learner (workers/learner.py): an objective registered here, unknown to the learner,
trains through it; its summed metric is the whole mini-batch's loss however the rows are split; the
forward computes what the objective asks; the batch is checked against the objective's keys."""

import copy

import pytest
import torch

from hybrid_rl.algorithms import agg_loss
from hybrid_rl.objectives import ForwardNeeds, MicroBatch, Objective, build_objective, register_objective
from hybrid_rl.objectives.registry import unregister_objective
from hybrid_rl.workers.learner import Learner
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import hf_response_log_probs, make_batch

SEEN: list[MicroBatch] = []
"""The micro-batches the test objective was called with (latest update)."""


class _NLL(Objective):
    """Token-mean negative log-likelihood of the responses, weighted by a per-row ``weights`` column."""

    reads = ("response_mask", "weights")

    def __init__(self, config=None, entropy: bool = False):
        super().__init__(config)
        self.entropy = entropy

    @property
    def forward(self) -> ForwardNeeds:
        return ForwardNeeds(entropy=self.entropy)

    @property
    def summed(self):
        return ("custom/nll",)

    def step_metrics(self):
        return {"custom/steps": 1.0}

    def __call__(self, mb):
        SEEN.append(mb)
        loss = agg_loss(-mb.log_prob * mb.batch["weights"][:, None], mb.mask, **mb.agg)
        return loss, {"custom/nll": loss.detach(), "custom/rows": torch.tensor(float(mb.mask.shape[0]))}


@pytest.fixture(scope="module")
def nll_name():
    register_objective("test_weighted_nll")(_NLL)
    yield "test_weighted_nll"
    unregister_objective("test_weighted_nll")


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


def _data():
    data = make_batch()
    data.batch["weights"] = torch.linspace(0.5, 2.0, 8)
    return data


def _learner(model, lr=1e-2, **kw):
    kw = {"mini_batch_rows": 8, "micro_batch_rows": 8, **kw}
    return Learner(model, torch.optim.SGD(model.parameters(), lr=lr), **kw)


def _hand_nll(model, data):
    """sum(-w * log pi * mask) / sum(mask) from a plain transformers forward (T = 0.7)."""
    mask = data.batch["response_mask"].float()
    log_prob = hf_response_log_probs(model, data, 0.7)
    return float((-log_prob * data.batch["weights"][:, None] * mask).sum() / mask.sum())


def test_a_new_objective_trains_without_touching_the_learner(base_model, nll_name):
    model = copy.deepcopy(base_model)
    learner, objective, data = _learner(model), build_objective(nll_name), _data()
    first = _hand_nll(model, data)
    metrics = learner.update(data, objective, metric_prefix="learner")
    assert metrics["custom/nll"][0] == pytest.approx(first, abs=1e-5)  # the whole mini-batch's loss
    for _ in range(4):
        learner.update(data, objective, metric_prefix="learner")
    assert _hand_nll(model, data) < first - 0.05
    assert set(metrics) == {"custom/nll", "custom/rows", "custom/steps", "learner/padding_frac", "learner/grad_norm",
                            "learner/num_skipped_steps"}
    assert metrics["custom/steps"] == [1.0] and metrics["learner/num_skipped_steps"] == [0]
    assert SEEN[-1].entropy is None and SEEN[-1].topk_log_prob is None  # nothing asked, nothing computed
    assert SEEN[-1].on_policy and set(SEEN[-1].batch) == {"response_mask", "weights"}  # only its own keys


@pytest.mark.parametrize("split", [dict(micro_batch_rows=3), dict(micro_batch_rows=1),
                                   dict(use_dynamic_bsz=True, max_token_len=20, micro_batch_rows=None),
                                   dict(micro_batch_rows=4, use_remove_padding=True)],
                         ids=["micro3", "micro1", "dynamic", "packed"])
def test_the_split_does_not_change_the_update(base_model, nll_name, split):
    whole_model, split_model = copy.deepcopy(base_model), copy.deepcopy(base_model)
    whole = _learner(whole_model).update(_data(), build_objective(nll_name))
    parts = _learner(split_model, **split).update(_data(), build_objective(nll_name))
    assert len(parts["custom/rows"]) == len(parts["learner/padding_frac"]) > 1  # per micro-batch
    assert sum(parts["custom/rows"]) == 8
    assert parts["custom/nll"][0] == pytest.approx(whole["custom/nll"][0], rel=1e-5)
    for (name, a), b in zip(whole_model.state_dict().items(), split_model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


def test_epochs_and_mini_batches_each_take_a_step(base_model, nll_name):
    learner = _learner(copy.deepcopy(base_model), mini_batch_rows=4, micro_batch_rows=2)
    metrics = learner.update(_data(), build_objective(nll_name), epochs=2, shuffle=True)
    assert len(metrics["learner/grad_norm"]) == len(metrics["custom/nll"]) == len(metrics["custom/steps"]) == 4
    assert len(metrics["custom/rows"]) == 8
    assert not SEEN[-1].on_policy


def test_the_forward_computes_what_the_objective_asks(base_model, nll_name):
    _learner(copy.deepcopy(base_model)).update(_data(), _NLL(entropy=True))
    assert SEEN[-1].entropy is not None and SEEN[-1].entropy.shape == (8, 5) and not SEEN[-1].entropy.requires_grad


def test_the_batch_is_checked_against_the_objective(base_model, nll_name):
    data = _data()
    del data.batch["weights"]
    with pytest.raises(ValueError, match=r"update: the test_weighted_nll objective needs batch keys \['weights'\]"):
        _learner(copy.deepcopy(base_model)).update(data, build_objective(nll_name))
    with pytest.raises(ValueError, match="update needs an optimizer; this learner was built without one"):
        Learner(base_model, mini_batch_rows=8).update(_data(), build_objective(nll_name))
    no_temperature = _data()
    no_temperature.meta_info.clear()
    with pytest.raises(ValueError, match=r"update: data.meta_info lacks \['temperature'\]"):
        _learner(copy.deepcopy(base_model)).update(no_temperature, build_objective(nll_name))
