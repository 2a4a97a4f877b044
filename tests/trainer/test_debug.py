"""python -m hybrid_rl.debug: rollout (generate + score, no training) and reward (score a JSONL file)."""

import json
import subprocess
import sys

import pytest

from hybrid_rl.debug import debug_reward, debug_rollout
from test_e2e import REPO


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_debug_reward_scores_a_file(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", [
        {"data_source": "arithmetic", "response": "so #### 42", "ground_truth": "42"},
        {"data_source": "arithmetic", "solution_str": "#### 41", "ground_truth": 42, "extra_info": {"a": 1}},
    ])
    rows = debug_reward([], src, str(tmp_path / "out.jsonl"))
    assert [(r["score"], r["status"]) for r in rows] == [(1.0, "ok"), (0.0, "ok")]
    written = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert [r["score"] for r in written] == [1.0, 0.0] and written[1]["extra_info"] == {"a": 1}
    out = capsys.readouterr().out
    assert "arithmetic: 'so #### 42'" in out


def test_debug_reward_bad_lines_are_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match="row 2: needs data_source, response"):
        debug_reward([], _jsonl(tmp_path / "a.jsonl", [{"data_source": "x", "response": "r", "ground_truth": 1},
                                                         {"response": "r"}]))
    bad = tmp_path / "b.jsonl"
    bad.write_text("{oops\n")
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.debug", "reward", "--input", str(bad)],
                            capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(
        "hybrid_rl config error: data file") and "line 1: invalid JSON" in result.stderr


def test_debug_reward_numbers_rows_by_line_as_the_data_messages(tmp_path, capsys):
    # line 1 a sample, line 2 blank, line 3 a sample, line 4 one without a response: "row 4", as an editor shows
    ok = json.dumps({"data_source": "arithmetic", "response": "#### 2", "ground_truth": "2"})
    path = tmp_path / "in.jsonl"
    path.write_text(f"{ok}\n\n{ok}\n" + json.dumps({"data_source": "arithmetic", "ground_truth": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"row 4: needs data_source, response \(or solution_str\) and ground_truth; "
                                         r"missing \['response'\]"):
        debug_reward([], str(path))
    path.write_text(f"{ok}\n\n{ok}\n")
    capsys.readouterr()
    debug_reward([], str(path))
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[1:]] == ["1", "3"], printed  # the lines, not positions 0 and 1


@pytest.mark.slow
def test_debug_rollout_writes_experiences(tmp_path, tiny_model_dir, capsys):
    overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
                 "data.arithmetic.num_train=16", "data.arithmetic.num_test=4", "data.arithmetic.num_shots=0",
                 "data.max_prompt_length=160",
                 "data.max_response_length=8", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                 "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "trainer.n_gpus_per_node=1", "ray_init.num_cpus=2", f"trainer.default_local_dir={tmp_path}/run"]
    rows = debug_rollout(overrides, num_prompts=3, output=str(tmp_path / "exp.db"))
    assert len(rows) == 6 and all(r["policy_version"] == 0 for r in rows)
    assert [r["uid"] for r in rows[:2]] == ["0-0", "0-0"]  # the n samples of a prompt share its uid
    from hybrid_rl.buffer import SQLBuffer

    stored = SQLBuffer(str(tmp_path / "exp.db")).read()
    assert [e.response_ids for e in stored] == [r["response_ids"] for r in rows]
    out = capsys.readouterr().out
    assert out.count("\n") >= 7 and "prompt -> response" in out and "6 experiences written" in out
    assert not (tmp_path / "run" / "global_step_1").exists()  # nothing was trained or saved
