"""Rollout correction in the trainer: the step plan it asks for, and short real runs (HF engine, tiny
model) with the driver-side correction and with bypass mode."""

import pytest

from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli
from tests.trainer.test_e2e_agent import agent_files, chatty_model_dir  # noqa: F401  (fixtures)

LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"


def _plan(tmp_path, *extra):
    cfg = get_config([f"data.arithmetic.cache_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/run", *extra])
    return RayPPOTrainer(cfg, for_training=False).step_plan()


def test_the_step_plan_follows_the_correction(tmp_path):
    default = _plan(tmp_path)  # on-policy: the actor's detached log-probs, no old-log-prob pass
    assert "compute_old_log_prob" not in default and "compute_rollout_correction" not in default
    corrected = _plan(tmp_path, "algorithm.rollout_correction.preset=tis", LOG_PROBS)
    assert corrected.index("compute_old_log_prob") < corrected.index("compute_rollout_correction") \
        < corrected.index("compute_advantage")
    bypass = _plan(tmp_path, "algorithm.rollout_correction.preset=bypass_ppo_clip", LOG_PROBS)
    assert "use_rollout_log_probs" in bypass and "compute_old_log_prob" not in bypass
    assert "compute_rollout_correction" not in bypass  # the actor's loss corrects at every micro-batch
    measured = _plan(tmp_path, LOG_PROBS, "actor_rollout_ref.actor.ppo_mini_batch_size=8")  # off-policy updates
    assert "compute_old_log_prob" in measured and "compute_rollout_correction" in measured  # metrics only
    measured = _plan(tmp_path, LOG_PROBS, "algorithm.rollout_correction.preset=metrics")  # on-policy, measured
    assert "compute_old_log_prob" in measured and "compute_rollout_correction" in measured


@pytest.mark.parametrize("settings, keys", [
    (["algorithm.rollout_correction.preset=k3_rs_token_tis", "algorithm.rollout_correction.rollout_rs_threshold=0.5"],
     ["rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_seq_mean_k3_mean", "rollout_corr/kl",
      "rollout_corr/log_ppl_diff", "timing_s/compute_rollout_correction"]),
    (["algorithm.rollout_correction.preset=bypass_pg_is"],
     ["rollout_corr/rollout_is_mean", "rollout_corr/chi2_token", "rollout_corr/kl", "timing_s/use_rollout_log_probs"]),
])
def test_a_corrected_run_trains_and_reports_the_mismatch(tmp_path, tiny_model_dir, settings, keys):
    result = _run_cli(tmp_path, tiny_model_dir, LOG_PROBS, *settings, "trainer.n_gpus_per_node=1",
                      "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.val_before_train=false",
                      "trainer.val_at_end=false")
    _assert_ok(result)
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for key in keys:
        assert key in rows[-1], (key, sorted(k for k in rows[-1] if "rollout_corr" in k))
    # the HF engine samples in float32 like the actor: the two policies nearly agree
    assert abs(rows[-1]["rollout_corr/kl"]) < 0.05


@pytest.mark.parametrize("settings, message", [
    (["algorithm.rollout_correction.preset=metrics"], "preset=metrics corrects against the rollout engine's log-probs"),
    ([LOG_PROBS, "algorithm.rollout_correction.preset=bypass_ppo_clip", "algorithm.rollout_correction.rollout_is=token"],
     "would count twice"),
    (["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1.0]"],
     "1 weights for 2"),
    (["actor_rollout_ref.actor.policy_loss.dro_beta=-1"], "dro_beta=-1.0 is invalid"),
])
def test_bad_combinations_are_one_line(tmp_path, settings, message):
    from hybrid_rl.trainer.config.checks import validate_config
    from hybrid_rl.trainer.config.loader import to_ppo_config

    with pytest.raises(ValueError, match=message):
        validate_config(to_ppo_config(get_config([f"data.arithmetic.cache_dir={tmp_path}", *settings])))


@pytest.mark.slow
def test_the_correction_runs_decoupled_and_multi_turn_with_lora(tmp_path, tiny_model_dir, chatty_model_dir,
                                                                agent_files):
    """The decoupled mode (the buffer carries the engine's log-probs; the proximal pass is the old
    policy), and a multi-turn LoRA run in bypass mode (the chatty model takes several turns: the
    interaction's replies are observation tokens, masked out)."""
    from tests.trainer.test_e2e_agent import _agent_args, _agent_env
    from tests.trainer.test_e2e_async import _async_args

    common = [LOG_PROBS, "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.save_freq=-1",
              "trainer.val_before_train=false", "trainer.val_at_end=false"]
    decoupled = tmp_path / "decoupled"
    decoupled.mkdir()
    _assert_ok(_run_cli(decoupled, tiny_model_dir, *common, *_async_args(), "algorithm.rollout_correction.preset=tis"))
    assert "rollout_corr/rollout_is_mean" in _rows(decoupled / "run")[-1]
    agent = tmp_path / "agent"
    agent.mkdir()
    _assert_ok(_run_cli(agent, chatty_model_dir, *common, *_agent_args(agent_files), "actor_rollout_ref.model.lora_rank=8",
                        "actor_rollout_ref.actor.optim.lr=1e-2", "algorithm.rollout_correction.preset=bypass_pg_is",
                        env=_agent_env(agent_files)))
    row = _rows(agent / "run")[-1]
    assert "rollout_corr/rollout_is_mean" in row and row["rollout_corr/rollout_is_mean"] > 0
    assert row["agent/num_turns/mean"] > 1 and row["agent/observation_token_fraction"] > 0  # observations inside

