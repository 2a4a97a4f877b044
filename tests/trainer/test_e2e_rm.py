"""GRPO with a learned reward model through the CLI on the tiny model: the colocated reward-model
worker (RM + rule combination, scores side by side in the metrics) and a remote reward service."""

from __future__ import annotations

import pytest

from tests.reward.test_remote import _Service
from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli

pytestmark = pytest.mark.slow


def test_grpo_with_a_colocated_reward_model_and_a_rule(tmp_path, tiny_model_dir):
    from tests.tiny_models import build_tiny_reward_model_dir

    rm = build_tiny_reward_model_dir(tmp_path / "rm", tiny_model_dir, mean=0.5, std=2.0)
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={rm}",
                        "reward_model.rm_weight=2.0", "reward_model.rule_weight=0.5", "trainer.total_training_steps=2",
                        "trainer.save_freq=2"))
    for row in [r for r in _rows(tmp_path / "run") if "critic/score/mean" in r]:
        expected = 2.0 * row["critic/rm_score/mean"] + 0.5 * row["critic/rule_score/mean"]
        assert row["critic/score/mean"] == pytest.approx(expected, abs=1e-5)
        # normalised with the saved statistics: mean over rows of (raw - 0.5) / 2
        assert row["critic/rm_score/mean"] == pytest.approx((row["critic/rm_score_raw/mean"] - 0.5) / 2.0, abs=1e-5)
        assert row["timing_s/compute_rm_score"] > 0 and "perf/peak_rss_gib/rm_score" in row


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
    """async_training with reward_model.model.path=<URL>: the producer's reward threads call the service."""
    service = _Service()
    try:
        _assert_ok(_run_cli(tmp_path, tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={service.url}",
                            "async_training.enable=true", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                            "trainer.total_training_steps=2",
                            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"))
    finally:
        service.server.shutdown()
    rows = [r for r in _rows(tmp_path / "run") if "critic/score/mean" in r]
    assert [r["training/global_step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["reward/rm_num_failed"] == 0 and row["critic/rm_score/mean"] > 0
        assert row["critic/score/mean"] == pytest.approx(row["critic/rm_score/mean"])
    assert len(service.requests) >= 2  # at least the two trained batches were scored by the service
