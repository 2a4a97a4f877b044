"""DataParallelPPOActor on one process: log-probs vs plain HF, split invariance, metrics, skipping."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_optimizer
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, hf_response_log_probs, make_batch, ppo_batch


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


def _meta(data, micro=3, dynamic=False, max_tokens=None):
    data.meta_info.update(micro_batch_size=micro, use_dynamic_bsz=dynamic, max_token_len=max_tokens)
    return data


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compute_log_prob_matches_hf_forward(base_model, remove_padding, dynamic):
    data = _meta(make_batch(), micro=3, dynamic=dynamic, max_tokens=16)
    actor = DataParallelPPOActor(actor_config(), base_model, use_remove_padding=remove_padding)
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    expected = hf_response_log_probs(base_model, data, temperature=0.7)
    mask = data.batch["response_mask"].bool()
    assert log_probs.shape == expected.shape == (8, 5)
    torch.testing.assert_close(log_probs[mask], expected[mask], atol=1e-5, rtol=0)
    # entropy of the tempered distribution, recomputed by hand
    b = data.batch
    logits = base_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        position_ids=b["position_ids"]).logits[:, -6:-1] / 0.7
    p = torch.softmax(logits, -1)
    expected_entropy = -(p * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(entropy[mask], expected_entropy[mask].detach(), atol=1e-5, rtol=1e-5)


def test_compute_log_prob_requires_meta(base_model):
    actor = DataParallelPPOActor(actor_config(), base_model)
    with pytest.raises(ValueError, match="temperature"):
        actor.compute_log_prob(make_batch())


_prepared_batch = ppo_batch


def _run_update(model, data, adam=False, remove_padding=False, **cfg):
    """Copy of ``model`` after update_policy. SGD by default: Adam's first step is ~lr*sign(g), which
    turns fp32 rounding of near-zero gradient entries into lr-sized differences, while SGD keeps
    parameter differences proportional to gradient differences (what split invariance is about)."""
    model = copy.deepcopy(model)
    config = actor_config(**cfg)
    optimizer = (build_optimizer(model, config.optim) if adam
                 else torch.optim.SGD(model.parameters(), lr=config.optim.lr))
    actor = DataParallelPPOActor(config, model, optimizer, use_remove_padding=remove_padding)
    metrics = actor.update_policy(data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def _assert_same_params(a, b, atol=1e-5):
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_update_policy_is_micro_batch_invariant(base_model, mode):
    data = _prepared_batch(base_model)
    common = dict(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.01)
    full, metrics_full = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=8, **common)
    one, metrics_one = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=1, **common)
    four, _ = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=4, **common)
    dyn, _ = _run_update(base_model, data, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20,
                         ppo_micro_batch_size_per_gpu=None, **common)
    rmpad, _ = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=4, remove_padding=True,
                           **common)
    changed = max((full[k] - base_model.state_dict()[k]).abs().max().item() for k in full)
    assert changed > 1e-3  # the update did something
    for other in (one, four, dyn, rmpad):
        _assert_same_params(full, other)
    # Relative: a grad norm of ~59 differs by ~1e-5 relative between summation orders (AMX kernels).
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert metrics_full[key][0] == pytest.approx(metrics_one[key][0], rel=1e-4, abs=1e-5), key


def test_update_policy_metrics_and_two_mini_batches(base_model):
    data = _prepared_batch(base_model)
    params, metrics = _run_update(base_model, data, adam=True, ppo_mini_batch_size=4,
                                  ppo_micro_batch_size_per_gpu=2, ppo_epochs=2, use_kl_loss=True)
    assert any((params[k] - v).abs().max() > 1e-3 for k, v in base_model.state_dict().items())
    # 2 epochs x 2 mini-batches = 4 optimizer steps; 2 micro-batches each
    assert len(metrics["actor/grad_norm"]) == 4 and len(metrics["actor/pg_loss"]) == 4
    assert len(metrics["actor/pg_clipfrac"]) == 8
    assert metrics["actor/num_skipped_steps"] == [0]
    for key in ("actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy", "actor/kl_loss"):
        assert all(math.isfinite(v) for v in metrics[key]), key


def test_update_policy_matches_hand_loss(base_model):
    """pg_loss metric of one full mini-batch equals the token-mean PPO loss computed by hand."""
    data = _prepared_batch(base_model)
    _, metrics = _run_update(base_model, data)
    b = data.batch
    mask = b["response_mask"].float()
    ratio = torch.exp(hf_response_log_probs(base_model, data, 0.7) - b["old_log_probs"])
    adv = b["advantages"]
    losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    losses = torch.where(adv < 0, torch.minimum(losses, -adv * 3.0), losses)
    expected = (losses * mask).sum() / mask.sum()
    assert metrics["actor/pg_loss"][0] == pytest.approx(expected.item(), abs=1e-5)


def test_non_finite_gradient_skips_the_step(base_model):
    data = _prepared_batch(base_model)
    data.batch["advantages"][0, 0] = float("nan")
    params, metrics = _run_update(base_model, data)
    assert metrics["actor/num_skipped_steps"] == [1]
    assert not math.isfinite(metrics["actor/grad_norm"][0])
    _assert_same_params(params, base_model.state_dict(), atol=0)


def test_update_policy_rejects_uneven_mini_batches(base_model):
    data = _prepared_batch(base_model, num_rows=6)
    with pytest.raises(ValueError, match="mini-batch is 8 rows"):
        _run_update(base_model, data)


def test_update_policy_with_kl_loss_needs_ref(base_model):
    data = make_batch()
    data.batch["old_log_probs"] = torch.zeros(8, 5)
    with pytest.raises(ValueError, match="ref_log_prob"):
        _run_update(base_model, data, use_kl_loss=True)


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, base_model):
    from hybrid_rl.workers.builders import build_causal_lm
    from hybrid_rl.workers.config import FSDPConfig, ModelConfig

    data = _prepared_batch(base_model)
    model = build_causal_lm(ModelConfig(path=tiny_model_dir, enable_gradient_checkpointing=True),
                            tiny_model_dir, FSDPConfig(), torch.device("cpu"), trainable=True)
    assert model.is_gradient_checkpointing
    plain, _ = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=4)
    checkpointed, _ = _run_update(model, data, ppo_micro_batch_size_per_gpu=4)
    _assert_same_params(plain, checkpointed)


@pytest.mark.parametrize("micro", [8, 3])
def test_on_policy_update_without_old_log_probs_equals_precomputed(base_model, micro):
    """One mini-batch x one epoch: dropping old_log_probs (the actor then uses its own detached
    log-probs) gives the same update as passing the exact current log-probs, with ratio 1."""
    data = _prepared_batch(base_model)
    data.batch["old_log_probs"] = hf_response_log_probs(base_model, data, 0.7).detach()
    common = dict(ppo_micro_batch_size_per_gpu=micro, use_kl_loss=True, kl_loss_coef=0.04)
    with_old, m_old = _run_update(base_model, data, **common)
    without = data.select(batch_keys=[k for k in data.batch.keys() if k != "old_log_probs"])
    detached, m_det = _run_update(base_model, without, **common)
    _assert_same_params(with_old, detached)
    assert max(abs(v) for v in m_det["actor/ppo_kl"]) < 1e-12  # ratio exactly 1
    assert max(m_det["actor/pg_clipfrac"]) == 0.0
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert m_old[key][0] == pytest.approx(m_det[key][0], abs=1e-6), key


def test_off_policy_update_still_requires_old_log_probs(base_model):
    data = _prepared_batch(base_model)
    without = data.select(batch_keys=[k for k in data.batch.keys() if k != "old_log_probs"])
    with pytest.raises(ValueError, match="old_log_probs"):
        _run_update(base_model, without, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4)
    with pytest.raises(ValueError, match="old_log_probs"):
        _run_update(base_model, without, ppo_epochs=2)


def test_entropy_without_grad_when_not_in_the_loss(base_model):
    """entropy_coeff=0: the entropy is a metric only (no graph); with a coefficient it has one."""
    from hybrid_rl.workers.forward import response_log_probs

    data = make_batch()
    batch = dict(data.batch.items())
    _, ent = response_log_probs(base_model, batch, 0.7, False, True, entropy_grad=False)
    assert not ent.requires_grad
    lp, ent_g = response_log_probs(base_model, batch, 0.7, False, True, entropy_grad=True)
    assert ent_g.requires_grad and lp.requires_grad
    torch.testing.assert_close(ent, ent_g.detach(), atol=0, rtol=0)


def test_padding_fraction_of_micro_batches(base_model):
    from hybrid_rl.workers.forward import padding_fraction

    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])
    # the all-padding first column is trimmed: 2 rows x 5 columns computed, 8 valid
    assert padding_fraction(mask, use_remove_padding=False) == pytest.approx(0.2)
    assert padding_fraction(mask, use_remove_padding=True) == 0.0
    data = _prepared_batch(base_model)
    _, metrics = _run_update(base_model, data, ppo_micro_batch_size_per_gpu=4, remove_padding=True)
    assert metrics["actor/padding_frac"] == [0.0, 0.0]


def test_update_is_on_policy():
    from hybrid_rl.workers.config import update_is_on_policy

    assert update_is_on_policy(actor_config(ppo_mini_batch_size=8), train_batch_size=8)
    assert not update_is_on_policy(actor_config(ppo_mini_batch_size=4), train_batch_size=8)
    assert not update_is_on_policy(actor_config(ppo_mini_batch_size=8, ppo_epochs=2), train_batch_size=8)


def test_decoupled_loss_reads_the_rollout_log_probs(base_model):
    """loss_mode=decoupled with behaviour == proximal log-probs updates exactly as vanilla; with a
    staler behaviour policy every token is re-weighted, so the update differs."""
    from hybrid_rl.workers.config import PolicyLossConfig

    data = _prepared_batch(base_model)
    vanilla, _ = _run_update(base_model, data)
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"].clone()
    same, metrics = _run_update(base_model, data, policy_loss=PolicyLossConfig(loss_mode="decoupled"))
    _assert_same_params(vanilla, same, atol=0)
    assert all(w == pytest.approx(1.0) for w in metrics["actor/behav_imp_weight/mean"])
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"] - 0.5
    stale, metrics = _run_update(base_model, data, policy_loss=PolicyLossConfig(loss_mode="decoupled",
                                                                                behav_imp_weight_cap=1.5))
    assert max((stale[k] - vanilla[k]).abs().max().item() for k in stale) > 1e-4
    # every model token's weight is exp(0.5) ~ 1.65 > the cap: the metrics say so
    assert all(w == pytest.approx(math.exp(0.5), rel=1e-4) for w in metrics["actor/behav_imp_weight/max"])
    assert all(f == 1.0 for f in metrics["actor/behav_imp_weight/capped_frac"])


def test_bypass_mode_ppo_clip_is_vanilla_against_the_rollout_log_probs(base_model):
    """Bypass mode (meta_info["rollout_correction"]) with ppo_clip and nothing rejected updates exactly as
    vanilla PPO whose old log-probs are the rollout's; reinforce with token weights (the ratio, outside
    the clip range here) updates otherwise and reports the mismatch metrics of the current policy."""
    from dataclasses import asdict

    from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig

    data = _prepared_batch(base_model)
    # the engine's log-probs 0.5 below the model's own: every current-policy weight is e^0.5 > 1 + clip
    data.batch["rollout_log_probs"] = hf_response_log_probs(base_model, data, 0.7) - 0.5
    reference = copy.deepcopy(data)
    reference.batch["old_log_probs"] = data.batch["rollout_log_probs"].clone()
    want, _ = _run_update(base_model, reference)
    data.meta_info["rollout_correction"] = asdict(RolloutCorrectionConfig(bypass_mode=True, loss_type="ppo_clip"))
    got, metrics = _run_update(base_model, data)
    _assert_same_params(want, got, atol=0)
    assert "rollout_corr/kl" in metrics and "rollout_corr/rollout_is_mean" not in metrics
    data.meta_info["rollout_correction"] = asdict(RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce",
                                                                          rollout_is="token"))
    reinforce, metrics = _run_update(base_model, data)
    assert max((reinforce[k] - want[k]).abs().max().item() for k in want) > 1e-6
    assert all(w == pytest.approx(math.exp(0.5), rel=1e-3) for w in metrics["rollout_corr/rollout_is_mean"])
    assert "actor/ppo_kl" in metrics and "actor/pg_clipfrac" not in metrics  # reinforce clips nothing (veRL)
