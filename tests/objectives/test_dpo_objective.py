"""The DPO family and Bradley-Terry as objectives: values and gradients equal TRL's formulas (written
here from TRL 0.26's ``DPOTrainer.dpo_loss`` / ``CPOTrainer.cpo_loss``, independently of the code under
test), hand-computed tiny cases, micro-batch split invariance, the pair layout and the config errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from hybrid_rl.algorithms.preference_loss import DPO_LOSS_TYPES, dpo_loss, dpo_metrics, sequence_log_probs
from hybrid_rl.algorithms.reward_loss import bradley_terry_loss, preference_metrics
from hybrid_rl.objectives import MicroBatch, build_objective, objective_info
from hybrid_rl.objectives.preference import BradleyTerryObjective, DPOConfig, DPOObjective

KEY = "actor_rollout_ref.actor.objective"


# ---------------------------------------------------------------- TRL's formulas, transcribed
def trl_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, label_smoothing=0.0,
                 reference_free=False):
    """TRL 0.26 ``DPOTrainer.dpo_loss`` (f_divergence reverse KL) for sigmoid/robust/hinge/ipo."""
    logratios = chosen - rejected
    ref_logratios = torch.tensor([0], dtype=logratios.dtype) if reference_free else ref_chosen - ref_rejected
    logits = logratios - ref_logratios
    if loss_type == "sigmoid":
        losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                  - F.logsigmoid(-beta * logits) * label_smoothing)
    elif loss_type == "robust":
        losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                  + F.logsigmoid(-beta * logits) * label_smoothing) / (1 - 2 * label_smoothing)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        assert loss_type == "ipo"
        losses = (logits - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * (chosen - ref_chosen).detach()
    rejected_rewards = beta * (rejected - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


def trl_simpo_loss(chosen, rejected, beta, simpo_gamma, label_smoothing=0.0):
    """TRL 0.26 ``CPOTrainer.cpo_loss`` with ``loss_type="simpo"`` (alpha 0)."""
    logits = chosen - rejected
    gamma_logratios = simpo_gamma / beta
    logits = logits - gamma_logratios
    losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
              - F.logsigmoid(-beta * logits) * label_smoothing)
    return losses, beta * chosen.detach(), beta * rejected.detach()


def _random_logps(pairs=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    policy = [(-20 * torch.rand(pairs, generator=gen, dtype=torch.float64)).requires_grad_() for _ in range(2)]
    ref = [-20 * torch.rand(pairs, generator=gen, dtype=torch.float64) for _ in range(2)]
    return policy, ref


CASES = [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("robust", 0.1, 0.1), ("robust", 0.3, 0.0),
         ("hinge", 0.1, 0.0), ("ipo", 0.1, 0.0), ("ipo", 0.7, 0.0)]


@pytest.mark.parametrize("loss_type,beta,smoothing", CASES)
def test_reference_losses_equal_trl_values_and_gradients(loss_type, beta, smoothing):
    (pc, pr), (rc, rr) = _random_logps()
    ours = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type=loss_type, label_smoothing=smoothing)
    ours_grad = torch.autograd.grad(ours[0].sum(), (pc, pr))
    theirs = trl_dpo_loss(pc, pr, rc, rr, beta, loss_type, smoothing)
    theirs_grad = torch.autograd.grad(theirs[0].sum(), (pc, pr))
    for a, b in zip(ours + ours_grad, theirs + theirs_grad):
        assert torch.allclose(a, b, rtol=1e-6, atol=0)


@pytest.mark.parametrize("beta,gamma,smoothing", [(0.1, 0.5, 0.0), (2.0, 1.0, 0.0), (2.5, 0.3, 0.15)])
def test_simpo_equals_trl_cpo_values_and_gradients(beta, gamma, smoothing):
    (pc, pr), _ = _random_logps(seed=1)
    # length-normalised log-probs are what simpo reads
    ours = dpo_loss(pc / 9.0, pr / 4.0, beta=beta, loss_type="simpo", simpo_gamma=gamma, label_smoothing=smoothing)
    ours_grad = torch.autograd.grad(ours[0].sum(), (pc, pr))
    theirs = trl_simpo_loss(pc / 9.0, pr / 4.0, beta, gamma, smoothing)
    theirs_grad = torch.autograd.grad(theirs[0].sum(), (pc, pr))
    for a, b in zip(ours + ours_grad, theirs + theirs_grad):
        assert torch.allclose(a, b, rtol=1e-6, atol=0)


def test_reference_free_sigmoid_equals_trl_and_rewards_are_beta_logps():
    (pc, pr), (rc, rr) = _random_logps(seed=2)
    ours = dpo_loss(pc, pr, None, None, beta=0.2, loss_type="sigmoid", reference_free=True)
    theirs = trl_dpo_loss(pc, pr, rc, rr, 0.2, "sigmoid", reference_free=True)
    assert torch.allclose(ours[0], theirs[0], rtol=1e-6, atol=0)
    assert torch.equal(ours[1], 0.2 * pc.detach()) and torch.equal(ours[2], 0.2 * pr.detach())


def _one(value):
    return torch.tensor([value], dtype=torch.float64)


@pytest.mark.parametrize("loss_type,beta,smoothing,logit,expected", [
    ("sigmoid", 0.1, 0.0, 0.0, math.log(2)),  # equal log-ratios: -log(1/2)
    ("sigmoid", 0.1, 0.0, 10.0, math.log(1 + math.exp(-1))),  # -log sigmoid(1)
    ("sigmoid", 0.1, 0.25, 10.0, 0.75 * math.log(1 + math.exp(-1)) + 0.25 * math.log(1 + math.exp(1))),
    ("robust", 0.1, 0.25, 0.0, (0.75 * math.log(2) - 0.25 * math.log(2)) / 0.5),  # = log 2
    ("hinge", 0.1, 0.0, 5.0, 0.5),  # relu(1 - 0.5)
    ("hinge", 0.1, 0.0, 20.0, 0.0),
    ("ipo", 0.25, 0.0, 3.0, 1.0),  # (3 - 1/(2*0.25))^2
])
def test_hand_computed_pairs(loss_type, beta, smoothing, logit, expected):
    # chosen -1 vs rejected -3 under the reference (ratio 2); the policy's ratio is 2 + logit
    losses, chosen_r, rejected_r = dpo_loss(_one(-1.0), _one(-3.0 - logit), _one(-1.0), _one(-3.0), beta=beta,
                                            loss_type=loss_type, label_smoothing=smoothing)
    assert losses.item() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert chosen_r.item() == 0.0 and rejected_r.item() == pytest.approx(-beta * logit, rel=1e-12)


def test_simpo_hand_computed():
    # pi_c - pi_r = 10, beta 0.1, gamma 0.5: -log sigmoid(1 - 0.5)
    losses, chosen_r, _ = dpo_loss(_one(-2.0), _one(-12.0), beta=0.1, loss_type="simpo", simpo_gamma=0.5)
    assert losses.item() == pytest.approx(math.log(1 + math.exp(-0.5)), rel=1e-12)
    assert chosen_r.item() == pytest.approx(-0.2, rel=1e-12)


def test_dpo_loss_argument_errors():
    x = _one(-1.0)
    with pytest.raises(ValueError, match="unknown DPO loss_type 'kto'"):
        dpo_loss(x, x, x, x, loss_type="kto")
    with pytest.raises(ValueError, match="needs the reference log-probs"):
        dpo_loss(x, x, loss_type="sigmoid")
    with pytest.raises(ValueError, match="equal shape"):
        dpo_loss(x, torch.zeros(2, dtype=torch.float64), x, x)


def test_sequence_log_probs_sum_and_mean():
    log_prob = torch.tensor([[-1.0, -2.0, -7.0], [-3.0, -5.0, -6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(sequence_log_probs(log_prob, mask), torch.tensor([-3.0, -14.0]))
    assert torch.allclose(sequence_log_probs(log_prob, mask, average=True), torch.tensor([-1.5, -14.0 / 3]))


def test_metrics_have_trl_names_and_hand_values():
    metrics = dpo_metrics(torch.tensor([0.3, -0.1]), torch.tensor([0.1, 0.2]), torch.tensor([-4.0, -6.0]),
                          torch.tensor([-5.0, -9.0]))
    expected = {"rewards/chosen": 0.1, "rewards/rejected": 0.15, "rewards/accuracies": 0.5,
                "rewards/margins": -0.05, "logps/chosen": -5.0, "logps/rejected": -7.0}
    assert metrics.keys() == expected.keys()
    for name, value in expected.items():
        assert metrics[name].item() == pytest.approx(value, abs=1e-7)


# ---------------------------------------------------------------- the dpo objective
def _pair_batch(pairs=4, length=5, seed=3):
    """``2 * pairs`` rows, chosen/rejected adjacent, random masks with >= 1 token per row."""
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * pairs
    mask = (torch.rand(rows, length, generator=gen) < 0.7).to(torch.float64)
    mask[:, 0] = 1.0
    log_prob = (-3 * torch.rand(rows, length, generator=gen, dtype=torch.float64)).requires_grad_()
    ref = -3 * torch.rand(rows, length, generator=gen, dtype=torch.float64)
    return log_prob, mask, ref


def _micro(log_prob, mask, ref, num_seqs):
    return MicroBatch({"response_mask": mask, "ref_log_prob": ref}, log_prob, {"global_batch_num_seqs": num_seqs})


def _trl_reference_mean(log_prob, mask, ref, config):
    """TRL's whole-batch loss: its ``concatenated_forward`` reduction (mean for ipo/simpo) then ``losses.mean()``."""
    reduce = (lambda t: (t * mask).sum(-1) / mask.sum(-1)) if config.loss_type in ("ipo", "simpo") else \
        (lambda t: (t * mask).sum(-1))
    logps, ref_logps = reduce(log_prob), reduce(ref)
    if config.loss_type == "simpo":
        return trl_simpo_loss(logps[0::2], logps[1::2], config.beta, config.simpo_gamma,
                              config.label_smoothing)[0].mean()
    return trl_dpo_loss(logps[0::2], logps[1::2], ref_logps[0::2], ref_logps[1::2], config.beta, config.loss_type,
                        config.label_smoothing, config.reference_free)[0].mean()


CONFIGS = [DPOConfig(), DPOConfig(beta=0.3, label_smoothing=0.1), DPOConfig(loss_type="robust", label_smoothing=0.2),
           DPOConfig(loss_type="hinge"), DPOConfig(loss_type="ipo", beta=0.5), DPOConfig(reference_free=True),
           DPOConfig(loss_type="simpo", beta=2.0, simpo_gamma=1.0)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.loss_type}-{c.beta}-{c.reference_free}")
def test_objective_equals_trl_batch_loss_and_gradient(config):
    log_prob, mask, ref = _pair_batch()
    loss, metrics = DPOObjective(config)(_micro(log_prob, mask, ref, 8.0))
    grad = torch.autograd.grad(loss, log_prob)[0]
    expected = _trl_reference_mean(log_prob, mask, ref, config)
    expected_grad = torch.autograd.grad(expected, log_prob)[0]
    assert torch.allclose(loss, expected, rtol=1e-6, atol=0)
    assert torch.allclose(grad, expected_grad, rtol=1e-6, atol=1e-15)
    assert metrics["dpo/loss"].item() == loss.item() and not metrics["dpo/loss"].requires_grad
    assert set(metrics) == {"dpo/loss", "dpo/rewards/chosen", "dpo/rewards/rejected", "dpo/rewards/accuracies",
                            "dpo/rewards/margins", "dpo/logps/chosen", "dpo/logps/rejected"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.loss_type}-{c.beta}-{c.reference_free}")
def test_micro_batch_split_invariance(config):
    log_prob, mask, ref = _pair_batch(pairs=4)
    objective = DPOObjective(config)
    whole, _ = objective(_micro(log_prob, mask, ref, 8.0))
    whole_grad = torch.autograd.grad(whole, log_prob)[0]
    parts = [objective(_micro(log_prob[s], mask[s], ref[s], 8.0))[0] for s in (slice(0, 2), slice(2, 8))]
    split_grad = torch.autograd.grad(parts[0] + parts[1], log_prob)[0]
    assert torch.allclose(parts[0] + parts[1], whole, rtol=1e-12, atol=0)
    assert torch.allclose(split_grad, whole_grad, rtol=1e-12, atol=1e-15)


def test_objective_hand_computed_micro_batch():
    # one pair: chosen tokens (-1, -1), rejected (-2, -2, pad); reference -1.5 everywhere
    log_prob = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    ref = torch.full((2, 3), -1.5)
    loss, metrics = DPOObjective(DPOConfig(beta=0.5))(_micro(log_prob, mask, ref, 4.0))  # 2 pairs in all
    # logits = (-2 - -4) - (-3 - -3) = 2; -log sigmoid(0.5 * 2) / 2 pairs
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)) / 2, rel=1e-6)
    assert metrics["dpo/rewards/chosen"].item() == pytest.approx(0.5)  # 0.5 * (-2 - -3)
    assert metrics["dpo/rewards/rejected"].item() == pytest.approx(-0.5)
    assert metrics["dpo/rewards/accuracies"].item() == 1.0 and metrics["dpo/rewards/margins"].item() == 1.0
    assert metrics["dpo/logps/chosen"].item() == -2.0 and metrics["dpo/logps/rejected"].item() == -4.0


def test_local_pair_count_without_global_denominator():
    log_prob, mask, ref = _pair_batch(pairs=2)
    objective = DPOObjective()
    with_global, _ = objective(_micro(log_prob, mask, ref, 4.0))
    local, _ = objective(MicroBatch({"response_mask": mask, "ref_log_prob": ref}, log_prob, {}))
    assert torch.equal(local, with_global)


def test_odd_rows_refused():
    log_prob, mask, ref = _pair_batch(pairs=2)
    with pytest.raises(ValueError, match="micro-batch of 3 rows: not whole .* even batch and micro-batch size"):
        DPOObjective()(_micro(log_prob[:3], mask[:3], ref[:3], 4.0))


def test_keys_and_reference_declarations():
    assert objective_info("dpo").paired and objective_info("dpo").needs_reference
    sigmoid = build_objective("dpo", {"beta": 0.2})
    assert sigmoid.required_keys() == ["response_mask", "ref_log_prob"] and sigmoid.needs_reference
    for settings in ({"loss_type": "simpo"}, {"reference_free": True}):
        objective = build_objective("dpo", settings)
        assert objective.required_keys() == ["response_mask"] and not objective.needs_reference
    simpo = build_objective("dpo", {"loss_type": "simpo"})
    log_prob, mask, _ = _pair_batch(pairs=1)
    loss, _ = simpo(MicroBatch({"response_mask": mask}, log_prob, {}))  # no ref_log_prob needed
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match=r"needs batch keys \['ref_log_prob'\]"):
        sigmoid.check_keys(["response_mask"])


def test_all_loss_types_are_listed():
    assert DPO_LOSS_TYPES == ("sigmoid", "robust", "hinge", "ipo", "simpo")


@pytest.mark.parametrize("settings,message", [
    ({"loss_type": "kto"}, f"{KEY}.loss_type='kto' is not a DPO loss type; valid: "),
    ({"beta": 0}, f"{KEY}.beta must be > 0, got 0"),
    ({"beta": "0.1"}, f"{KEY}.beta must be a finite number, got '0.1'"),
    ({"beta": float("nan")}, f"{KEY}.beta must be a finite number, got nan"),
    ({"label_smoothing": 0.5}, rf"{KEY}.label_smoothing must be in \[0, 0.5\), got 0.5"),
    ({"label_smoothing": -0.1}, rf"{KEY}.label_smoothing must be in \[0, 0.5\), got -0.1"),
    ({"loss_type": "hinge", "label_smoothing": 0.1}, f"{KEY}.label_smoothing=0.1 has no effect with loss_type='hinge'"),
    ({"simpo_gamma": -1}, f"{KEY}.simpo_gamma must be >= 0, got -1"),
    ({"reference_free": "yes"}, f"{KEY}.reference_free must be true or false, got 'yes'"),
    ({"bta": 0.1}, f"{KEY}.bta is not a setting of the dpo objective"),
])
def test_config_errors_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as err:
        build_objective("dpo", settings)
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


# ---------------------------------------------------------------- bradley_terry
def _scores(rows=6, seed=4):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, generator=gen, dtype=torch.float64).requires_grad_()


def test_bradley_terry_equals_reward_loss_and_rm_metrics():
    scores = _scores()
    margin = torch.tensor([0.5, 99.0, 0.0, 99.0, 1.0, 99.0], dtype=torch.float64)  # rejected rows' values unread
    objective = build_objective("bradley_terry")
    loss, metrics = objective(MicroBatch({"margin": margin}, None, {"global_batch_num_seqs": 6.0}, scores=scores))
    chosen, rejected = scores[0::2], scores[1::2]
    expected = bradley_terry_loss(chosen, rejected, torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))
    assert torch.equal(loss, expected)
    by_hand = -(F.logsigmoid(chosen - rejected - torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))).mean()
    assert torch.allclose(loss, by_hand, rtol=1e-12)
    rm = preference_metrics(chosen, rejected)
    assert metrics["rm/loss"].item() == loss.item() and objective.summed == ("rm/loss",)
    assert {k: v.item() for k, v in metrics.items() if k != "rm/loss"} == rm
    assert objective_info("bradley_terry").paired and not objective_info("bradley_terry").needs_reference


def test_bradley_terry_split_invariance():
    scores = _scores(rows=8)
    objective = BradleyTerryObjective()
    whole, _ = objective(MicroBatch({}, None, {"global_batch_num_seqs": 8.0}, scores=scores))
    whole_grad = torch.autograd.grad(whole, scores)[0]
    parts = [objective(MicroBatch({}, None, {"global_batch_num_seqs": 8.0}, scores=scores[s]))[0]
             for s in (slice(0, 6), slice(6, 8))]
    split_grad = torch.autograd.grad(parts[0] + parts[1], scores)[0]
    assert torch.allclose(parts[0] + parts[1], whole, rtol=1e-12) and torch.allclose(split_grad, whole_grad)


def test_bradley_terry_input_errors():
    objective = BradleyTerryObjective()
    with pytest.raises(ValueError, match=r"one score per row \(\[b\]\) from a scalar head, got \(4, 3\)"):
        objective(MicroBatch({}, None, {}, scores=torch.zeros(4, 3)))
    with pytest.raises(ValueError, match="micro-batch of 5 rows"):
        objective(MicroBatch({}, None, {}, scores=torch.zeros(5)))
    with pytest.raises(ValueError, match="has no settings"):
        build_objective("bradley_terry", {"beta": 1.0})
