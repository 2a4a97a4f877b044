"""Registries describe their entries: what each estimator and loss needs, read by the driver and the
checks, so a user registration gets the same treatment as a built-in one."""

import pytest
import torch

from hybrid_rl.algorithms import (AdvEstimatorInfo, PolicyLossInfo, adv_estimator_info, describe_adv_estimators,
                                  describe_policy_losses, policy_loss_info, register_adv_est, register_policy_loss,
                                  registered_adv_estimators, registered_policy_losses, unregister_adv_est,
                                  unregister_policy_loss)
from hybrid_rl.algorithms.registry import Registry, first_doc_line
from hybrid_rl.trainer.config.checks import make_run_plan, validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.config.verl_compat import recommended_setting_notices

USER = "test_only_user_estimator"


@pytest.fixture(autouse=True)
def _fresh_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkpoint of another run turns into a resume error


@pytest.fixture
def user_estimator():
    """A user estimator registered for one test: ``(register(**needs))`` then removed."""
    def register(**needs):
        @register_adv_est(USER, **needs)
        def score_minus_group_mean(token_level_rewards, response_mask, **_):
            """Score minus the group mean. More text here."""
            return token_level_rewards, token_level_rewards

        return score_minus_group_mean

    yield register
    unregister_adv_est(USER)


def _cfg(*overrides):
    return to_ppo_config(get_config(list(overrides)))


def test_every_builtin_entry_describes_itself():
    estimators, losses = describe_adv_estimators(), describe_policy_losses()
    assert list(estimators) == registered_adv_estimators() and list(losses) == registered_policy_losses()
    assert all(isinstance(i, AdvEstimatorInfo) and i.description for i in estimators.values())
    assert all(isinstance(i, PolicyLossInfo) and i.description for i in losses.values())
    assert [n for n, i in estimators.items() if i.needs_critic] == ["gae"]
    assert [n for n, i in estimators.items() if i.needs_groups] == [
        "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "reinforce_plus_plus_baseline", "rloo",
        "rloo_vectorized"]
    assert [n for n, i in estimators.items() if i.needs_greedy_baseline] == ["remax"]
    assert [n for n, i in losses.items() if i.needs_rollout_log_probs] == ["decoupled"]
    assert [n for n, i in losses.items() if not i.uses_advantages] == ["sft"]
    assert policy_loss_info("gspo").recommended["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"


def test_unknown_names_name_the_valid_ones():
    with pytest.raises(ValueError, match="registered: .*'grpo'"):
        adv_estimator_info("gpro")
    with pytest.raises(ValueError, match="actor.policy_loss.loss_mode"):
        policy_loss_info("vanila")


def test_a_user_estimator_that_needs_groups_gets_the_grpo_check(user_estimator):
    user_estimator(needs_groups=True)
    for name in ("grpo", USER):
        with pytest.raises(ValueError, match=f"adv_estimator={name} compares the responses to the same prompt"):
            validate_config(_cfg(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=1",
                                 "critic.rollout_n=1"))
    validate_config(_cfg(f"algorithm.adv_estimator={USER}"))  # n=8: fine


def test_a_user_estimator_that_needs_a_critic_gets_one(user_estimator):
    user_estimator(needs_critic=True)
    cfg = _cfg(f"algorithm.adv_estimator={USER}")
    validate_config(cfg)
    assert make_run_plan(cfg).use_critic
    # the critic's batch checks apply to it as to gae
    with pytest.raises(ValueError, match="critic.ppo_mini_batch_size"):
        validate_config(_cfg(f"algorithm.adv_estimator={USER}", "critic.ppo_mini_batch_size=5"))


def test_a_user_estimator_that_needs_a_greedy_baseline_gets_the_step(user_estimator):
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

    user_estimator(needs_greedy_baseline=True)
    trainer = RayPPOTrainer(_cfg(f"algorithm.adv_estimator={USER}"))
    assert trainer.plan.use_greedy_baseline and "compute_reward_baseline" in trainer.step_plan()
    assert "compute_reward_baseline" not in RayPPOTrainer(_cfg()).step_plan()
    with pytest.raises(ValueError, match=f"adv_estimator={USER} generates a greedy baseline.*grpo"):
        validate_config(_cfg(f"algorithm.adv_estimator={USER}", "async_training.enable=true",
                             "trainer.n_gpus_per_node=1", "ray_init.num_cpus=2"))


def test_a_loss_that_needs_rollout_log_probs_requires_them_in_either_mode():
    @register_policy_loss("test_only_needs_behaviour", needs_rollout_log_probs=True)
    def loss(old_log_prob, log_prob, advantages, response_mask, **_):
        """A test loss."""
        zero = torch.zeros(())
        return zero, zero, zero, zero

    try:
        for mode in ("decoupled", "test_only_needs_behaviour"):
            with pytest.raises(ValueError, match=f"loss_mode={mode} needs the behaviour log-probs.*calculate_log_probs"):
                validate_config(_cfg(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"))
            validate_config(_cfg(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
                                 "actor_rollout_ref.rollout.calculate_log_probs=true"))
    finally:
        unregister_policy_loss("test_only_needs_behaviour")
    assert "test_only_needs_behaviour" not in registered_policy_losses()


def test_recommended_settings_give_one_notice_each_unless_set():
    overrides = ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.clip_ratio_low=0.0003"]
    notices = recommended_setting_notices(_cfg(*overrides), overrides)
    assert len(notices) == 2 and "clip_ratio_high=0.0004 (this run has null)" in notices[0]
    assert "loss_agg_mode=seq-mean-token-mean" in notices[1]
    assert recommended_setting_notices(_cfg(), []) == []


def test_registry_rejects_duplicates_and_unregisters():
    registry: Registry[str] = Registry("thing", "x.thing")
    registry.register("a", "info-a")(len)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", "again")(len)
    assert registry.info("a") == "info-a" and registry.describe() == {"a": "info-a"}
    registry.unregister("a")
    registry.unregister("a")  # no-op
    assert "a" not in registry and registry.names() == []


def test_first_doc_line_is_the_first_sentence():
    def fn():
        """ReMax (Li et al. 2023): return-to-go minus
        the greedy reward. More detail.

        Args: none."""

    assert first_doc_line(fn) == "ReMax (Li et al. 2023): return-to-go minus the greedy reward."
    assert first_doc_line(lambda: None) == ""
