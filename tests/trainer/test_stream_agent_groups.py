"""Agent groups of the streaming producer (stream_groups.py): requests carry each row's non-tensor columns,
and a group of streamed trajectories is assembled in the batch path's trajectory layout with per-token
versions (-1 on observations and padding). Expected values are written out by hand for a 2-row group."""

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation
from hybrid_rl.trainer.ppo.stream_groups import assemble_group, group_requests, split_groups
from hybrid_rl.workers.rollout.params import GenerationParams

R = 6
PARAMS = GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=None, eos_token_ids=(2,),
                          pad_token_id=0, response_length=R)


def _group():
    batch = DataProto.from_dict(
        {"input_ids": torch.tensor([[0, 7, 8]]), "attention_mask": torch.tensor([[0, 1, 1]]),
         "position_ids": torch.tensor([[0, 0, 1]])},
        non_tensors={"agent_name": np.array(["env"], dtype=object),
                     "extra_info": np.array([{"index": 3}], dtype=object)})
    (group,) = split_groups(generation.prepare_rollout_batch(batch, 2, 1), 2, batch=1)
    return group


def _sample(rid, prompt, response, mask, versions, score):
    info = {"response_mask": mask, "num_turns": 4, "tool_rewards": [0.5], "turn_scores": [1.0, 0.0],
            "agent_metrics": {"env_steps": 2.0}, "reward_score": score, "prompt_width": 4}
    return {"request_id": rid, "prompt_ids": prompt, "response_ids": response, "log_probs": [-0.5] * len(response),
            "versions": versions, "finish_reason": "stop", "meta": {"row": {}, "trajectory": info}}


def test_agent_requests_carry_the_rows_columns_and_plain_requests_do_not():
    group = _group()
    agent = group_requests(group, R, agent_rows=True)
    assert [r["meta"]["row"]["agent_name"] for r in agent] == ["env", "env"]
    assert agent[0]["meta"]["row"]["extra_info"] == {"index": 3} and agent[0]["prompt_ids"] == [7, 8]
    assert [r["meta"] for r in group_requests(group, R)] == [{}, {}]


def test_an_agent_group_is_assembled_in_the_trajectory_layout_with_versions():
    group = _group()
    # row 0: model 2 tokens (v0, v1), observation 1 token, model 1 token (v1); row 1: the loop's own prompt
    group.samples = {0: _sample("1:0:0", [7, 8], [4, 5, 9, 2], [1, 1, 0, 1], [0, 1, -1, 1], 1.0),
                     1: _sample("1:0:1", [6, 7, 8], [3, 2], [1, 1], [1, 1], 0.0)}
    out = assemble_group(group, PARAMS, with_log_probs=True)
    b = out.batch
    assert b["prompts"].tolist() == [[0, 0, 7, 8], [0, 6, 7, 8]]  # left-padded to prompt_width 4
    assert b["responses"].tolist() == [[4, 5, 9, 2, 0, 0], [3, 2, 0, 0, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 1, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert b["rollout_versions"].tolist() == [[0, 1, -1, 1, -1, -1], [1, 1, -1, -1, -1, -1]]
    assert b["rollout_log_probs"].tolist() == [[-0.5] * 4 + [0.0] * 2, [-0.5] * 2 + [0.0] * 4]
    nt = out.non_tensor_batch
    assert list(nt["num_turns"]) == [4, 4] and list(nt["reward_score"]) == [1.0, 0.0]
    assert list(nt["turn_scores"]) == [[1.0, 0.0], [1.0, 0.0]] and list(nt["tool_rewards"]) == [[0.5], [0.5]]
    assert nt["agent_metrics"][0] == {"env_steps": 2.0} and list(nt["uid"]) == ["1-0", "1-0"]
