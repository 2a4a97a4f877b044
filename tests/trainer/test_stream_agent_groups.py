"""Agent groups of the streaming producer (stream_groups.py): requests carry each row's non-tensor columns,
and a group of streamed trajectories is assembled in the batch path's trajectory layout with per-token
versions (-1 on observations and padding); a streamed step's ``agent/*`` metrics, computed from its rows'
``agent_metrics``, equal the batch path's for the same rows. Expected values are written out by hand."""

import json
import random

import numpy as np
import torch

from hybrid_rl.agents.loop import END_REASONS, Trajectory
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation
from hybrid_rl.trainer.ppo.stream_groups import agent_batch_metrics, assemble_group, group_requests, split_groups
from hybrid_rl.workers.rollout.multi_turn import _row_metrics, batch_metrics
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


def _trajectories():
    """num_turns 4 / 2 / 6; observation tokens 3 / 0 / 3 of 6 / 3 / 5; ends stop / length / error."""
    return [Trajectory(prompt_ids=[1], response_ids=[0] * 6, response_mask=[1, 1, 0, 0, 0, 1], assistant_turns=2,
                       user_turns=1, tool_calls=1, tool_metrics={"tool/calc/correct": 1.0}, end_reason="stop"),
            Trajectory(prompt_ids=[1], response_ids=[0] * 3, response_mask=[1, 1, 1], assistant_turns=1,
                       tool_metrics={"loop/env_steps": 3.0}, end_reason="length"),
            Trajectory(prompt_ids=[1], response_ids=[0] * 5, response_mask=[1, 0, 0, 0, 1], assistant_turns=3,
                       user_turns=2, tool_errors=1, tool_timeouts=1, end_reason="error")]


def test_agent_metrics_of_rows_are_the_hand_computed_batch_values():
    # the rows as the trainer gets them back from the buffer (extra columns stored as JSON)
    rows = [json.loads(json.dumps(_row_metrics(t))) for t in _trajectories()] + [None]  # a row without the column
    m = agent_batch_metrics(rows)
    assert m["agent/num_turns/mean"] == 4.0 and m["agent/assistant_turns/mean"] == 2.0
    assert m["agent/tool_calls/mean"] == m["agent/tool_errors/mean"] == m["agent/tool_timeouts/mean"] == 1 / 3
    assert m["agent/observation_token_fraction"] == 6 / 14  # (3 + 0 + 3) / (6 + 3 + 5): a ratio of sums
    assert m["agent/tool/calc/correct"] == 1 / 3 and m["agent/loop/env_steps"] == 1.0  # absent counts 0
    assert [m[f"agent/ended_by/{r}"] for r in END_REASONS] == [1 / 3, 1 / 3, 0.0, 0.0, 0.0, 1 / 3]
    assert agent_batch_metrics([None, None]) == {} and agent_batch_metrics([]) == {}


def test_agent_metrics_of_rows_equal_the_batch_paths_exactly():
    rng = random.Random(0)
    trajs = []
    for _ in range(37):
        mask = [rng.randint(0, 1) for _ in range(rng.randint(0, 12))]
        tools = {f"tool/t{k}/score": rng.random() for k in range(3) if rng.random() < 0.4}
        trajs.append(Trajectory(prompt_ids=[1], response_ids=[0] * len(mask), response_mask=mask,
                                assistant_turns=rng.randint(1, 5), user_turns=rng.randint(0, 4),
                                tool_calls=rng.randint(0, 3), tool_errors=rng.randint(0, 1),
                                tool_metrics={**tools, "loop/env_return": rng.random()},
                                end_reason=rng.choice(END_REASONS)))
    rows = [json.loads(json.dumps(_row_metrics(t))) for t in trajs]
    assert agent_batch_metrics(rows) == batch_metrics(trajs)  # same keys, bit-identical values
