"""Driver-side batch operations: repeat + uid, in-reward KL, advantage dispatch."""

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms import AdaptiveKLController, FixedKLController
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation
from hybrid_rl.trainer.ppo import ops as ppo_ops


def _prompts():
    return DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, 5], [6, 7]]), "attention_mask": torch.tensor([[0, 1], [1, 1]]),
                 "position_ids": torch.tensor([[0, 0], [0, 1]])},
        non_tensors={"data_source": ["a", "b"]},
    )


def test_prepare_rollout_batch_interleaves_with_shared_uid():
    out = generation.prepare_rollout_batch(_prompts(), n=3, step=7)
    assert len(out) == 6
    assert out.non_tensor_batch["uid"].tolist() == ["7-0"] * 3 + ["7-1"] * 3
    assert out.non_tensor_batch["data_source"].tolist() == ["a"] * 3 + ["b"] * 3
    assert out.batch["input_ids"][:, -1].tolist() == [5, 5, 5, 7, 7, 7]


def test_split_and_merge_generation():
    batch = generation.prepare_rollout_batch(_prompts(), n=2, step=1)
    gen, rest = generation.split_generation_inputs(batch)
    assert set(gen.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert "uid" in gen.non_tensor_batch and len(rest.batch.keys()) == 0
    output = DataProto.from_dict(
        tensors={"responses": torch.ones(4, 3, dtype=torch.long), "input_ids": torch.zeros(4, 5, dtype=torch.long)},
        meta_info={"metrics": {"x": [1.0]}, "eos_token_id": 2},
    )
    merged = generation.merge_generation_output(rest, output)
    assert merged.batch["input_ids"].shape == (4, 5) and "responses" in merged.batch.keys()
    assert merged.meta_info["eos_token_id"] == 2 and "metrics" not in merged.meta_info
    assert merged.non_tensor_batch["uid"].tolist() == ["1-0", "1-0", "1-1", "1-1"]


def _scored():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    return DataProto.from_dict(tensors={
        "token_level_scores": scores,
        "response_mask": torch.tensor([[1, 1], [1, 0]]),
        "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, -2.0]]),
        "ref_log_prob": torch.tensor([[-1.5, -0.5], [-1.0, -9.0]]),
    })


def test_apply_kl_penalty_exact():
    ctrl = FixedKLController(0.1)
    data, metrics = ppo_ops.apply_kl_penalty(_scored(), ctrl, "kl")
    # k1 = old - ref, masked: row0 [0.5, -0.5], row1 [-1.0, 0]
    expected = torch.tensor([[-0.05, 1.05], [0.1, 0.0]])
    assert torch.allclose(data.batch["token_level_rewards"], expected)
    # per-sequence masked means: row0 0.0, row1 -1.0 -> batch mean -0.5
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(-0.5)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)


def test_adaptive_controller_is_updated():
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=10)
    ppo_ops.apply_kl_penalty(_scored(), ctrl, "abs")  # KL = mean(0.5, 1.0) = 0.75 -> error -0.2 (clipped)
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 10))


def test_compute_advantage_grpo_groups_by_uid():
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 3.0]]),
                 "response_mask": torch.ones(4, 2)},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    out = ppo_ops.compute_advantage(data, "grpo")
    # group a: scores 1, 0 -> mean 0.5, std (unbiased) 0.7071 -> +-0.7071; group b: identical -> 0
    adv = out.batch["advantages"][:, 0]
    assert torch.allclose(adv, torch.tensor([0.70710, -0.70710, 0.0, 0.0]), atol=1e-4)
    assert torch.equal(out.batch["advantages"][:, 0], out.batch["advantages"][:, 1])
