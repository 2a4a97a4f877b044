"""GRPO with a learned reward model through the CLI on the tiny model: the colocated reward-model
worker (RM + rule combination, scores side by side in the metrics), the same in the decoupled mode
(the reward model beside the rollout engine) and a remote reward service in both modes."""

from __future__ import annotations

import pytest
import torch

from tests.reward.test_remote import _Service
from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli, _weights

pytestmark = pytest.mark.slow


RM_ARGS = ("reward_model.enable=true", "reward_model.rm_weight=2.0", "reward_model.rule_weight=0.5",
           "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.n_gpus_per_node=1",
           "trainer.val_before_train=false", "trainer.test_freq=-1")


@pytest.fixture(scope="module")
def rm_runs(tmp_path_factory, tiny_model_dir):
    """The reward model's folder and the synchronous run with it colocated in the training worker."""
    from tests.tiny_models import build_tiny_reward_model_dir

    root = tmp_path_factory.mktemp("rm_runs")
    rm = build_tiny_reward_model_dir(root / "rm", tiny_model_dir, mean=0.5, std=2.0)
    (root / "sync").mkdir()
    # One thread per process, as in the decoupled run (a trainer and a rollout process).
    _assert_ok(_run_cli(root / "sync", tiny_model_dir, *RM_ARGS, f"reward_model.model.path={rm}", "ray_init.num_cpus=1"))
    return root, rm


def test_grpo_with_a_colocated_reward_model_and_a_rule(rm_runs):
    root, _ = rm_runs
    rows = [r for r in _rows(root / "sync" / "run") if "critic/score/mean" in r]
    assert [r["training/global_step"] for r in rows] == [1, 2]
    for row in rows:
        expected = 2.0 * row["critic/rm_score/mean"] + 0.5 * row["critic/rule_score/mean"]
        assert row["critic/score/mean"] == pytest.approx(expected, abs=1e-5)
        # normalised with the saved statistics: mean over rows of (raw - 0.5) / 2
        assert row["critic/rm_score/mean"] == pytest.approx((row["critic/rm_score_raw/mean"] - 0.5) / 2.0, abs=1e-5)
        assert row["timing_s/compute_rm_score"] > 0 and "perf/peak_rss_gib/rm_score" in row


def test_the_decoupled_mode_scores_with_the_reward_model_in_the_rollout_processes(rm_runs, tiny_model_dir):
    """async_training with a local reward model: it lives beside the rollout engine, the producer's
    reward threads call it; at eta 0 every score and the trained weights equal the synchronous run's."""
    root, rm = rm_runs
    (root / "async").mkdir()
    _assert_ok(_run_cli(root / "async", tiny_model_dir, *RM_ARGS, f"reward_model.model.path={rm}",
                        "async_training.enable=true", "async_training.max_head_offpolicyness=0",
                        "async_training.partial_rollout=false", "rollout.n_gpus_per_node=1"))
    sync = [r for r in _rows(root / "sync" / "run") if "critic/score/mean" in r]
    decoupled = [r for r in _rows(root / "async" / "run") if "critic/score/mean" in r]
    keys = ("critic/rm_score_raw/mean", "critic/rm_score/mean", "critic/rule_score/mean", "critic/score/mean",
            "actor/grad_norm")
    assert [[r[k] for k in keys] for r in decoupled] == [[r[k] for k in keys] for r in sync]
    assert all("timing_s/compute_rm_score" not in r for r in decoupled)  # scored by the producer, not a step
    assert (root / "async" / "run" / "logs" / "rollout").is_dir()
    want, got = _weights(root / "sync" / "run" / "global_step_2"), _weights(root / "async" / "run" / "global_step_2")
    assert want and got, "no model*.safetensors written at global_step_2"  # {} == {} would pass below
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_grpo_with_a_remote_reward_service(tmp_path, tiny_model_dir):
    service = _Service()  # reward = the response's length in characters
    try:
        _assert_ok(_run_cli(tmp_path, tiny_model_dir, "reward_model.enable=true",
                            f"reward_model.model.path={service.url}", "reward_model.micro_batch_size_per_gpu=3",
                            "trainer.total_training_steps=1",
                            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"))
    finally:
        service.server.shutdown()
    (row,) = [r for r in _rows(tmp_path / "run") if "critic/score/mean" in r]
    assert row["reward/rm_num_failed"] == 0 and row["critic/rm_score/mean"] > 0
    assert row["critic/score/mean"] == pytest.approx(row["critic/rm_score/mean"])  # the RM alone (rule_weight=0)
    assert [len(r["query"]) for r in service.requests] == [3, 3, 2]  # 8 rows, 3 per request


def test_the_decoupled_mode_scores_with_a_remote_reward_service(tmp_path, tiny_model_dir):
    """async_training with reward_model.model.path=<URL>, streamed (partial rollout, the decoupled mode's
    default): the producer's reward threads call the service for each finished group."""
    service = _Service()
    try:
        _assert_ok(_run_cli(tmp_path, tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={service.url}",
                            "async_training.enable=true", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                            "async_training.max_head_offpolicyness=0", "trainer.total_training_steps=2",
                            "actor_rollout_ref.rollout.calculate_log_probs=true",
                            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"))
    finally:
        service.server.shutdown()
    rows = [r for r in _rows(tmp_path / "run") if "critic/score/mean" in r]
    assert [r["training/global_step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["reward/rm_num_failed"] == 0 and row["critic/rm_score/mean"] > 0
        assert row["critic/score/mean"] == pytest.approx(row["critic/rm_score/mean"])
    assert len(service.requests) >= 2  # at least the two trained batches were scored by the service
