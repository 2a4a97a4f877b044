"""Issue 57 item 2 end to end: a black-box agent that runs a sub-agent (two independent call chains over
the OpenAI endpoint, the official client) trains under ``agent.rows=every_call``: every rollout gives two
rows (the main conversation's and the sub-agent's), both trained with the rollout's reward, and a
two-step run on the tiny model ends with a finite loss (CPU, float32, one process)."""

import math

import pytest
from test_e2e import _assert_ok, _overrides, _rows
from test_e2e_agent import _agent_env

pytestmark = pytest.mark.slow

_AGENT = '''
async def sometimes_a_sub_agent(client, row):
    """One row, or two when the main answer has an even length: the step's row count varies."""
    main = await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]), max_tokens=8)
    text = main.choices[0].message.content or ""
    if len(text) % 2 == 0:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}], max_tokens=6)
    return float(len(text) % 3 == 0)


async def with_sub_agent(client, row):
    main = await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]), max_tokens=8)
    text = main.choices[0].message.content or ""
    sub = await client.chat.completions.create(  # a sub-agent: its own conversation, not a continuation
        model="policy", messages=[{"role": "user", "content": "Check this answer: " + text[:16]}], max_tokens=8)
    return {"reward": float(len(text) % 2), "sub_tokens": float(sub.usage.completion_tokens)}
'''


@pytest.fixture(scope="module")
def every_call_files(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("every_call")
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"What is {a} + 4?"}],
             "reward_model": {"style": "agent", "ground_truth": str(a + 4)}, "agent_name": "oa_sub"}
            for a in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    entries = (("oa_sub", "with_sub_agent"), ("oa_maybe", "sometimes_a_sub_agent"))
    (root / "agents.yaml").write_text("".join(
        f"- name: {name}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n  agent: e2e_sub_agent.{agent}\n"
        for name, agent in entries))
    (root / "e2e_sub_agent.py").write_text(_AGENT)
    return root


def test_a_sub_agents_rows_train_with_the_rollouts_reward(tmp_path, tiny_model_dir, every_call_files):
    import os
    import subprocess
    import sys

    files = every_call_files
    dropped = ("trainer.n_gpus_per_node=2", "trainer.total_training_steps=3", "trainer.save_freq=1",
               "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    overrides = [o for o in _overrides(tmp_path, tiny_model_dir) if o not in dropped] + [
        f"data.train_files={files / 'train.parquet'}", "data.max_response_length=24",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={files / 'agents.yaml'}",
        "actor_rollout_ref.rollout.agent.rows=every_call", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.n_gpus_per_node=1", "trainer.single_process=true",
        "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.val_before_train=false",
        "trainer.val_at_end=false"]
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=tmp_path,
                            env={**os.environ, **_agent_env(files)}, capture_output=True, text=True, timeout=900)
    _assert_ok(result)
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"]) and row["agent/ended_by/error"] == 0
        assert row["agent/loop/rows"] == 2.0  # every rollout: the main conversation's row and the sub-agent's
        assert row["agent/loop/calls_off_row"] == 0.0 and row["agent/loop/calls"] == 2.0
        assert row["agent/loop/sub_tokens"] > 0  # the sub-agent sampled: its row has trained tokens
        # GRPO over n=2 rollouts gives +-0.5 / (sqrt(0.5) + 1e-6) or 0; each of a rollout's 2 rows gets half
        half = 0.5 / (0.5 ** 0.5 + 1e-6) / 2
        assert row["critic/advantages/max"] in (pytest.approx(0.0, abs=1e-6), pytest.approx(half))
        assert row["actor/grad_norm"] > 0


def test_varying_rows_over_two_workers_killed_mid_update_resume_to_the_same_weights(tmp_path, tiny_model_dir,
                                                                                   every_call_files):
    """1 or 2 rows per rollout (an odd row count pads a zero-mask row for the 2 workers); kill -9 in the
    second update, restart: the same final weights as the uninterrupted run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from test_e2e import _run_cli, _weights

    rows_file = every_call_files / "maybe.parquet"
    table = pq.read_table(every_call_files / "train.parquet").to_pylist()
    pq.write_table(pa.Table.from_pylist([dict(r, agent_name="oa_maybe") for r in table]), rows_file)
    args = (f"data.train_files={rows_file}", "data.max_response_length=16",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={every_call_files / 'agents.yaml'}",
            "actor_rollout_ref.rollout.agent.rows=every_call", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.val_at_end=false")
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    for root in (straight, faulty):
        root.mkdir()
    _assert_ok(_run_cli(straight, tiny_model_dir, *args, env=_agent_env(every_call_files)))
    rows = _rows(straight / "run")
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["actor/pg_loss"]) for r in rows)
    assert all(1.0 <= r["agent/loop/rows"] <= 2.0 for r in rows)
    env = _agent_env(every_call_files, HYBRID_RL_FAULT="kill:update_actor:2:1",
                     HYBRID_RL_FAULT_STATE=str(faulty / "faults"))
    _assert_ok(_run_cli(faulty, tiny_model_dir, *args, "trainer.max_restarts=1", env=env))
    a, b = _weights(straight / "run" / "global_step_2"), _weights(faulty / "run" / "global_step_2")
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key
