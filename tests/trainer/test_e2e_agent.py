"""Multi-turn end to end: the CLI with an interaction and the calculator tool, killed mid-update and
restarted, ends with exactly the weights of the uninterrupted run (CPU, float32, same seed). Half the
rows run a black-box agent through the OpenAI-compatible endpoint (the official openai client, a
tool loop of its own), so that path is killed and resumed too.

The tiny random model rarely ends a turn by itself, so a copy of it is made "chatty": its EOS row
of lm_head points along the mean final hidden state (EOS ~15% per token), and every trajectory has
several turns with interaction replies in between.
"""

import json
import os
import shutil

import pytest
import torch
from test_e2e import _assert_ok, _rows, _run_cli, _weights

pytestmark = pytest.mark.slow

NO_VAL = ("trainer.val_before_train=false", "trainer.val_at_end=false")


@pytest.fixture(scope="module")
def chatty_model_dir(tmp_path_factory, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("chatty") / "model"
    shutil.copytree(tiny_model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(3, 259, (16, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mean = model.model(ids).last_hidden_state.mean((0, 1))  # [H]
        model.lm_head.weight[2] = 4.0 * mean / mean.norm() ** 2
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def agent_files(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("agent_data")
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"What is {a} + 4?"}],
             "reward_model": {"ground_truth": str(a + 4)}, "agent_name": "tool_agent" if a % 2 else "oa_calc",
             "extra_info": {"interaction_kwargs": {"name": "base"},
                            "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": str(a + 4)}}}}}
            for a in range(16)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    (root / "interactions.yaml").write_text(
        "interaction:\n  - name: base\n    class_name: hybrid_rl.agents.interaction.BaseInteraction\n")
    (root / "agents.yaml").write_text("- name: oa_calc\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                                      "  agent: e2e_openai_agent.solve\n")
    (root / "e2e_openai_agent.py").write_text(_OPENAI_AGENT)
    return root


_OPENAI_AGENT = """
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object",
          "properties": {"expression": {"type": "string"}}}}}]


async def solve(client, row):
    messages = list(row["raw_prompt"])
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "And?"}]
    return None
"""


def _agent_args(files):
    return (f"data.train_files={files / 'train.parquet'}", "data.max_response_length=96",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + str(_recipe_tools()),
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={files / 'interactions.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={files / 'agents.yaml'}",
            "reward_model.tool_reward_weight=0.5", *NO_VAL)


def _agent_env(files, **extra):
    from test_e2e import REPO

    return {"PYTHONPATH": f"{REPO}{os.pathsep}{files}", **extra}  # the black-box agent's module


def _recipe_tools():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "recipes" / "calculator_agent" / "tools.yaml"


def test_multi_turn_run_killed_mid_update_resumes_to_the_same_weights(tmp_path, chatty_model_dir, agent_files):
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    for root in (straight, faulty):
        root.mkdir()
    _assert_ok(_run_cli(straight, chatty_model_dir, *_agent_args(agent_files), env=_agent_env(agent_files)))
    rows = _rows(straight / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["agent/num_turns/mean"] > 3 and 0 < row["agent/observation_token_fraction"] < 1
        # the interaction never lets an in-process trajectory just stop; only endpoint rows (half) may
        assert row["agent/ended_by/stop"] <= 0.5 and row["agent/ended_by/error"] == 0
        assert row["agent/loop/calls"] > 0.5  # the endpoint rows called the model (mean over all rows)
    env = _agent_env(agent_files, HYBRID_RL_FAULT="kill:update_actor:2:1",
                     HYBRID_RL_FAULT_STATE=str(faulty / "faults"))
    _assert_ok(_run_cli(faulty, chatty_model_dir, *_agent_args(agent_files), "trainer.max_restarts=1", env=env))
    a, b = _weights(straight / "run" / "global_step_3"), _weights(faulty / "run" / "global_step_3")
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert json.loads(json.dumps(_rows(faulty / "run")[-1]["agent/num_turns/mean"])) == rows[-1]["agent/num_turns/mean"]
