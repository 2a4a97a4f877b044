"""Driver metrics on a hand-built batch: every value below is computed by hand."""

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import metrics as M

EOS = 2


def _batch() -> DataProto:
    # 2 rows, prompt width 3 (row 0 has 2 real prompt tokens, row 1 has 3), response width 4.
    # row 0: response "5 6 EOS pad" (3 tokens, ended); row 1: "7 8 9 9" (4 tokens, cut off).
    responses = torch.tensor([[5, 6, EOS, 0], [7, 8, 9, 9]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    scores = torch.zeros(2, 4)
    scores[0, 2] = 1.0  # score sits at the last valid token
    rewards = scores.clone()
    rewards[1, 3] = -0.5
    advantages = torch.tensor([[1.0, 1.0, 1.0, 9.0], [-1.0, -1.0, -1.0, -1.0]])  # 9.0 is masked out
    old = torch.log(torch.full((2, 4), 0.5))
    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.5, 0.1], [0.5, 0.5, 0.5, 0.5]]))
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "token_level_scores": scores,
            "token_level_rewards": rewards,
            "advantages": advantages,
            "returns": advantages.clone(),
            "values": torch.zeros(2, 4),
            "old_log_probs": old,
            "rollout_log_probs": rollout,
        }
    )


def test_data_metrics_exact():
    m = M.compute_data_metrics(_batch(), use_critic=True)
    assert m["critic/score/mean"] == pytest.approx(0.5)
    assert m["critic/score/max"] == 1.0 and m["critic/score/min"] == 0.0
    assert m["critic/rewards/mean"] == pytest.approx(0.25)
    assert m["critic/rewards/min"] == pytest.approx(-0.5)
    # 7 valid tokens: three 1.0 and four -1.0 -> mean -1/7; the masked 9.0 is ignored.
    assert m["critic/advantages/mean"] == pytest.approx(-1 / 7)
    assert m["critic/advantages/max"] == 1.0
    assert m["response_length/mean"] == pytest.approx(3.5)
    assert m["response_length/max"] == 4.0
    assert m["response_length/clip_ratio"] == pytest.approx(0.5)
    assert m["prompt_length/mean"] == pytest.approx(2.5)
    assert m["prompt_length/clip_ratio"] == pytest.approx(0.5)
    # values all 0, returns = advantages: Var(returns - 0) / Var(returns) = 1 -> explained var 0.
    assert m["critic/vf_explained_var"] == pytest.approx(0.0)
    assert "critic/values/mean" in m


def test_data_metrics_without_critic_and_configured_limit():
    m = M.compute_data_metrics(_batch(), use_critic=False, max_response_length=8)
    assert not any(k.startswith("critic/values") for k in m)
    assert m["response_length/clip_ratio"] == 0.0


def test_explained_variance_perfect_critic():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    assert M.explained_variance(returns, returns.clone(), torch.ones(1, 3)) == pytest.approx(1.0)


def test_timing_and_throughput():
    batch = _batch()
    timing = {"generate": 2.0, "update_actor": 1.3, "step": 4.0}
    m = M.compute_timing_metrics(batch, timing)
    assert m["timing_s/generate"] == 2.0 and m["timing_s/step"] == 4.0
    assert m["timing_per_token_ms/generate"] == pytest.approx(2000.0 / 7)  # 7 response tokens
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1300.0 / 12)  # 5 prompt + 7 response
    t = M.compute_throughput_metrics(batch, timing, num_workers=2)
    assert t["perf/total_num_tokens"] == 12.0
    assert t["perf/throughput"] == pytest.approx(12 / (4.0 * 2))
    assert t["perf/time_per_step"] == 4.0


def test_areal_aliases():
    batch = _batch()
    base = M.compute_data_metrics(batch, use_critic=False)
    base["actor/pg_clipfrac"] = 0.125
    a = M.areal_aliases(base, batch, eos_token_id=EOS)
    assert a["task_reward"] == pytest.approx(0.5)
    assert a["no_eos_ratio"] == pytest.approx(0.5)  # row 1 never emitted EOS
    assert a["avg_seq_len"] == pytest.approx((5 + 7) / 2)
    assert a["actor_clip_ratio"] == 0.125
    # ratios over valid tokens: row0 1, 2, 1; row1 1, 1, 1, 1 -> 8/7
    assert a["importance_weight"] == pytest.approx(8 / 7)
    assert M.areal_aliases(base, batch, eos_token_id=[9, EOS])["no_eos_ratio"] == 0.0


def test_mfu_and_reduce():
    # 6 * 10 params * 100 tokens * 2 epochs / 1 s = 12000 FLOP/s over 2 workers x 6000 peak = 1.0
    assert M.compute_actor_mfu(10, 100, 2, 1.0, 6000.0, 2) == pytest.approx(1.0)
    assert M.compute_actor_mfu(10, 100, 2, 0.0, 6000.0, 2) == 0.0
    # 4 of the 10 params are the LM head, run on 25 of the 100 tokens: 6 * (6 * 100 + 4 * 25) * 2 = 8400
    assert M.compute_actor_mfu(10, 100, 2, 1.0, 4200.0, 2, head_params=4, head_tokens=25) == pytest.approx(1.0)
    assert M.reduce_metrics({"a": [1.0, 3.0], "b": 2, "c": torch.tensor([1.0, 2.0])}) == {"a": 2.0, "b": 2.0, "c": 1.5}
