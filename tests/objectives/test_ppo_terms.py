"""PPO's terms as objectives (hybrid_rl/objectives/ppo.py): each term's loss, gradient and metrics on
tiny inputs computed by hand, their key declarations, bypass mode's binding, and ppo_objective's
weights (the distillation term alone when use_task_rewards is false)."""

import math
from dataclasses import asdict

import pytest
import torch

from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig
from hybrid_rl.objectives import ForwardNeeds, MicroBatch, build_objective, registered_objectives
from hybrid_rl.objectives.distillation import DistillationTerm
from hybrid_rl.objectives.ppo import EntropyBonus, KLLoss, KLLossConfig, PolicyLoss, ppo_objective
from hybrid_rl.workers.config import ActorConfig
from hybrid_rl.workers.distillation_config import DistillationLossConfig

TOKEN_MEAN = {"loss_agg_mode": "token-mean", "global_batch_num_tokens": None, "global_batch_num_seqs": None}


def _micro(**extra):
    """One row, three tokens, the last one masked; ratio = [1, e^-0.5, 1]; advantages [1, -1, 2]."""
    log_prob = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    batch = {"response_mask": torch.tensor([[1.0, 1.0, 0.0]]), "advantages": torch.tensor([[1.0, -1.0, 2.0]]),
             "old_log_probs": torch.tensor([[-1.0, -1.5, -0.5]]), "ref_log_prob": torch.tensor([[-1.5, -1.0, -7.0]]),
             **extra.pop("batch", {})}
    return MicroBatch(batch, log_prob, dict(TOKEN_MEAN), entropy=torch.tensor([[1.0, 2.0, 5.0]]), **extra)


def test_vanilla_policy_loss_by_hand():
    """Token 0: ratio 1, A = 1: loss -1. Token 1: ratio e^-0.5 ~ 0.61, A = -1: the clip at 0.8 wins,
    loss 0.8, no gradient (dual clip 3 * |A| is not reached). Token-mean over 2: -0.1."""
    term = build_objective("policy_loss", {"loss_mode": "vanilla", "settings": {
        "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}})
    mb = _micro()
    loss, metrics = term(mb)
    assert loss.item() == pytest.approx(-0.1, abs=1e-7)
    assert metrics["actor/pg_loss"].item() == pytest.approx(-0.1, abs=1e-7)
    assert metrics["actor/pg_clipfrac"].item() == 0.5
    assert metrics["actor/ppo_kl"].item() == pytest.approx(0.25)  # mean(old - new) over the kept tokens
    assert metrics["actor/pg_clipfrac_lower"].item() == 0.0
    assert "actor/behav_imp_weight/mean" not in metrics  # no rollout log-probs: no behaviour statistics
    loss.backward()
    assert torch.allclose(mb.log_prob.grad, torch.tensor([[-0.5, 0.0, 0.0]]))  # d(-A r)/d log pi = -A r / 2
    assert term.summed == ("actor/pg_loss",) and term.forward == ForwardNeeds()


def test_policy_loss_keys_on_and_off_policy():
    term = PolicyLoss()
    assert term.required_keys(on_policy=False) == ["response_mask", "advantages", "old_log_probs"]
    assert term.required_keys(on_policy=True) == ["response_mask", "advantages"]
    # present old log-probs are used even on-policy; the rollout's are read when there
    assert term.input_keys(["response_mask", "advantages", "old_log_probs", "rollout_log_probs"], on_policy=True) == [
        "response_mask", "advantages", "old_log_probs", "rollout_log_probs"]
    with pytest.raises(ValueError, match=r"update_policy: the policy_loss objective needs batch keys \['old_log_probs'\]"):
        term.check_keys(["response_mask", "advantages"], on_policy=False, caller="update_policy")


def test_on_policy_without_old_log_probs_has_ratio_one():
    mb = _micro(on_policy=True)
    del mb.batch["old_log_probs"]
    loss, metrics = PolicyLoss()(mb)
    assert metrics["actor/ppo_kl"].item() == 0.0 and metrics["actor/pg_clipfrac"].item() == 0.0
    assert loss.item() == pytest.approx((-1.0 + 1.0) / 2)  # -A * 1 on the two kept tokens


def test_bypass_mode_binds_from_meta_info_and_needs_the_rollout_log_probs():
    term = PolicyLoss()
    term.bind({"rollout_correction": asdict(RolloutCorrectionConfig(bypass_mode=True, loss_type="ppo_clip"))})
    assert "rollout_log_probs" in term.required_keys()
    with pytest.raises(ValueError, match="set actor_rollout_ref.rollout.calculate_log_probs=true"):
        term.check_keys(["response_mask", "advantages", "old_log_probs"])
    # ppo_clip against the rollout's log-probs = vanilla with old := rollout
    mb = _micro(batch={"rollout_log_probs": torch.tensor([[-1.0, -1.5, -0.5]])})
    mb.batch["old_log_probs"] = torch.zeros(1, 3)  # ignored in bypass mode
    loss, metrics = term(mb)
    assert loss.item() == pytest.approx(-0.1, abs=1e-7)
    assert any(k.startswith("rollout_corr/") for k in metrics)
    term.bind({})  # the next update without a correction
    assert "rollout_log_probs" not in term.required_keys()


def test_behaviour_weight_statistics_with_rollout_log_probs():
    """pi_prox / pi_behav = e^0.5 on each kept token; capped at 1.5 they all count as capped."""
    term = PolicyLoss(build_objective("policy_loss", {"settings": {"behav_imp_weight_cap": 1.5}}).config)
    mb = _micro(batch={"rollout_log_probs": torch.tensor([[-1.5, -2.0, -1.0]])})
    _, metrics = term(mb)
    assert metrics["actor/behav_imp_weight/mean"] == pytest.approx(math.exp(0.5), rel=1e-6)
    assert metrics["actor/behav_imp_weight/capped_frac"] == 1.0


def test_entropy_term_by_hand():
    mb = _micro()
    loss, metrics = EntropyBonus()(mb)
    assert loss.item() == 1.5 and metrics == {"actor/entropy": loss}  # (1 + 2) / 2; the masked 5 is out
    assert EntropyBonus().forward == ForwardNeeds(entropy=True, entropy_grad=True)
    seq = MicroBatch({"response_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]])}, None,
                     {**TOKEN_MEAN, "loss_agg_mode": "seq-mean-token-sum"}, entropy=torch.tensor([[1.0, 2.0], [3.0, 9.0]]))
    assert EntropyBonus()(seq)[0].item() == 3.0  # sequence sums 3 and 3, their mean


def test_kl_loss_by_hand():
    """k3 with r = ref - log pi = [-0.5, 1.0]: e^r - r - 1 = [e^-0.5 - 0.5, e - 2], mean over 2."""
    term = KLLoss(KLLossConfig(kl_loss_type="low_var_kl", kl_loss_coef=0.25))
    loss, metrics = term(_micro())
    assert loss.item() == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2) / 2, rel=1e-6)
    assert set(metrics) == {"actor/kl_loss"} and term.step_metrics() == {"actor/kl_coef": 0.25}
    assert term.required_keys() == ["response_mask", "ref_log_prob"]
    mse, _ = KLLoss(KLLossConfig(kl_loss_type="mse"))(_micro())
    assert mse.item() == pytest.approx((0.5 * 0.25 + 0.5 * 1.0) / 2)


def test_ppo_objective_weights_and_sum():
    actor = ActorConfig(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    objective = ppo_objective(actor)
    assert [(t.name, w) for t, w in objective.terms] == [("policy_loss", 1.0), ("entropy", -0.01), ("kl_loss", 0.1)]
    mb = _micro(batch={})
    loss, metrics = objective(mb)
    pg, ent, kl = (term(mb)[0] for term, _ in objective.terms)
    assert loss.item() == (pg - 0.01 * ent + 0.1 * kl).item()
    assert objective.summed == ("actor/pg_loss", "actor/entropy", "actor/kl_loss")
    assert objective.step_metrics() == {"actor/kl_coef": 0.1}
    assert objective.forward == ForwardNeeds(entropy=True, entropy_grad=True)
    # entropy_coeff 0 and no KL loss: the entropy is reported without a gradient, no reference needed
    plain = ppo_objective(ActorConfig())
    assert plain.forward == ForwardNeeds(entropy=True, entropy_grad=False)
    assert "ref_log_prob" not in plain.required_keys() and plain.step_metrics() == {}


def test_distillation_with_and_without_task_rewards():
    actor = ActorConfig(entropy_coeff=0.01, use_kl_loss=True)
    with_task = ppo_objective(actor, DistillationLossConfig(distillation_loss_coef=0.5))
    assert [w for _, w in with_task.terms] == [1.0, -0.01, 0.001, 0.5]
    alone = ppo_objective(actor, DistillationLossConfig(use_task_rewards=False))
    assert [w for _, w in alone.terms] == [0.0, 0.0, 0.0, 1.0]  # the PPO terms report only
    assert alone.forward == ForwardNeeds(entropy=True, entropy_grad=False)
    mb = _micro(batch={"teacher_log_prob": torch.tensor([[-1.5, -1.0, -9.0]])})
    loss, metrics = alone(mb)
    assert loss.item() == alone.terms[-1][0](mb)[0].item()
    assert {"actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/distillation/loss"} <= set(metrics)
    topk = ppo_objective(actor, DistillationLossConfig(loss_mode="forward_kl_topk", topk=4))
    assert topk.forward.topk_ids_key == "teacher_topk_ids"
    assert {"teacher_log_prob", "teacher_topk_ids", "teacher_topk_log_probs"} <= set(topk.required_keys())


def test_the_terms_are_registered_with_their_configs():
    assert {"policy_loss", "entropy", "kl_loss", "distillation"} <= set(registered_objectives())
    assert build_objective("kl_loss", {"kl_loss_type": "mse"}).config.kl_loss_type == "mse"
    assert isinstance(build_objective("distillation", {"loss_mode": "k2"}), DistillationTerm)
    with pytest.raises(ValueError, match="kl_los_type is not a setting of the kl_loss objective"):
        build_objective("kl_loss", {"kl_los_type": "mse"})
    with pytest.raises(ValueError, match="policy loss"):
        build_objective("policy_loss", {"loss_mode": "nonesuch"})
