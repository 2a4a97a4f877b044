"""On-policy distillation through the CLI: the start-up checks (one line each, nothing started) and a
tiny run with the teacher pass and its metrics (learning itself: tests/workers/test_teacher.py)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from hybrid_rl.trainer import get_config
from hybrid_rl.trainer.config.checks import validate_config
from hybrid_rl.trainer.config.loader import to_ppo_config
from hybrid_rl.utils.testing import build_tiny_model_dir
from tests.trainer.test_e2e_agent import agent_files, chatty_model_dir  # noqa: F401  (fixtures)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("teacher"), seed=1)


def _problems(student, *overrides):
    cfg = to_ppo_config(get_config([f"actor_rollout_ref.model.path={student}", "distillation.enabled=true",
                                    *overrides]))
    with pytest.raises(ValueError) as info:
        validate_config(cfg)
    return [line for line in str(info.value).splitlines() if "distillation" in line]


def test_bad_teachers_are_one_line_each(tiny_model_dir, teacher_dir, tmp_path):
    key = "distillation.teacher_models.teacher_model.model_path"
    (line,) = _problems(tiny_model_dir)
    assert "needs a teacher" in line and key in line
    (line,) = _problems(tiny_model_dir, f"{key}={tmp_path}/missing")
    assert key in line and "is not a local HF model folder" in line
    (tmp_path / "empty").mkdir()
    (line,) = _problems(tiny_model_dir, f"{key}={tmp_path}/empty")
    assert key in line and "config.json" in line
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(teacher_dir):
        data = open(os.path.join(teacher_dir, name), "rb").read()
        (broken / name).write_bytes(data[:-64] if name == "model.safetensors" else data)  # a cut download
    (line,) = _problems(tiny_model_dir, f"{key}={broken}")
    assert key in line and "model.safetensors cannot be read" in line
    (line,) = _problems(tiny_model_dir, f"{key}=HuggingFaceTB/SmolLM2-135M-Instruct")  # another tokenizer
    assert "vocabulary" in line and "is not the student's" in line
    (line,) = _problems(tiny_model_dir, f"{key}={teacher_dir}", "distillation.distillation_loss.loss_mode=k1")
    assert "use_policy_gradient=true" in line
    (line,) = _problems(tiny_model_dir, f"{key}={teacher_dir}", "distillation.distillation_loss.loss_mode=nope")
    assert "not a registered distillation loss" in line


def _cli(root, student, teacher, *extra, env=None):
    overrides = [
        f"actor_rollout_ref.model.path={student}", f"data.arithmetic.cache_dir={root}/data",
        "data.arithmetic.num_train=48", "data.arithmetic.num_test=4", "data.arithmetic.num_shots=0",
        "data.max_prompt_length=160", "data.max_response_length=8", "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.total_training_steps=3", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.logger=[jsonl]", "trainer.progress_bar=false",
        "trainer.plot=false", f"trainer.default_local_dir={root}/run", "trainer.single_process=true",
        "distillation.enabled=true", f"distillation.teacher_models.teacher_model.model_path={teacher}", *extra]
    base = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    return subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=root,
                          env={**base, "PYTHONPATH": REPO, **(env or {})}, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("loss", [
    ["distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true"],
    ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
     "actor_rollout_ref.actor.use_kl_loss=true"],  # a LoRA student; its reference is the adapters-off base
    ["trainer.single_process=false", "async_training.enable=true", "rollout.n_gpus_per_node=1",
     "ray_init.num_cpus=2", "actor_rollout_ref.actor.policy_loss.loss_mode=decoupled",
     "actor_rollout_ref.rollout.calculate_log_probs=true"],  # the decoupled mode: the teacher in the training pool,
    # rows from the buffer (eta 1: its stale rows need the decoupled loss)
], ids=["k1_as_reward", "lora_student", "decoupled"])
def test_a_tiny_run_scores_with_the_teacher_and_logs_its_metrics(tmp_path, tiny_model_dir, teacher_dir, loss):
    result = _cli(tmp_path, tiny_model_dir, teacher_dir, "trainer.save_freq=-1", *loss)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["timing_s/teacher"] > 0 and math.isfinite(r["actor/distillation/loss"])
        assert r["actor/distillation/teacher_log_prob"] < 0
    assert all(r["actor/distillation/teacher_kl"] > 0 for r in rows)  # two different random models
    if "use_policy_gradient=true" in str(loss):
        assert all("actor/distillation/pg_clipfrac" in r for r in rows)


def test_a_multi_turn_student_distills_on_its_own_tokens(tmp_path, chatty_model_dir, teacher_dir, agent_files):
    """k3 alone (no task reward) on multi-turn agent rows: tool and interaction replies sit inside the
    response as observation tokens, which the teacher scores as context and the loss masks out."""
    from test_e2e_agent import _agent_args, _agent_env

    result = _cli(tmp_path, chatty_model_dir, teacher_dir, "trainer.save_freq=-1", "trainer.total_training_steps=2",
                  "distillation.distillation_loss.use_task_rewards=false", *_agent_args(agent_files),
                  env=_agent_env(agent_files))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/num_turns/mean"] > 1 and r["agent/observation_token_fraction"] > 0
        assert r["timing_s/teacher"] > 0 and r["actor/distillation/teacher_kl"] > 0
        assert r["actor/distillation/loss"] > 0


def test_the_teachers_own_pool_scores_as_the_colocated_teacher(tmp_path, tiny_model_dir, teacher_dir):
    """distillation.nnodes=1: the teacher in its own Ray worker, the student in another; step 1's
    rollout is the same as with the teacher in the student's process, and so are the teacher's scores."""
    runs = {"colocated": ["trainer.single_process=true"],
            "pool": ["trainer.single_process=false", "distillation.nnodes=1", "ray_init.num_cpus=2"]}
    first = {}
    for name, extra in runs.items():
        (tmp_path / name).mkdir()
        result = _cli(tmp_path / name, tiny_model_dir, teacher_dir, "trainer.save_freq=-1",
                      "trainer.total_training_steps=1", *extra)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        first[name] = json.loads((tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert os.listdir(tmp_path / "pool" / "run" / "logs" / "teacher")  # the pool worker's own log
    for key in ("actor/distillation/teacher_log_prob", "actor/distillation/teacher_kl", "response_length/mean"):
        assert first["pool"][key] == pytest.approx(first["colocated"][key], rel=1e-4, abs=1e-6), key


def test_a_teacher_pool_needs_ray(tiny_model_dir, teacher_dir):
    (line,) = [line for line in _problems(tiny_model_dir, f"distillation.teacher_models.teacher_model.model_path="
                                          f"{teacher_dir}", "distillation.nnodes=1", "trainer.single_process=true")]
    assert "the teachers' own pool (distillation.nnodes=1)" in line


def test_kill_9_mid_update_resumes_to_the_same_weights(tmp_path, tiny_model_dir, teacher_dir):
    """forward_kl_topk with the task reward; SIGKILL in step 3's update (the one process dies), then
    the same command again: the final weights equal an uninterrupted run's, bit for bit (CPU,
    float32, same seed)."""
    from test_e2e import _weights

    straight, faulted = tmp_path / "straight", tmp_path / "faulted"
    for root in (straight, faulted):
        root.mkdir()
    loss = ("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4")
    result = _cli(straight, tiny_model_dir, teacher_dir, "trainer.save_freq=1", *loss)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (straight / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["actor/distillation/teacher_mass"] <= 1.0001 and r["timing_s/teacher"] > 0 for r in rows)
    env = {"HYBRID_RL_FAULT": "kill:update_actor:3", "HYBRID_RL_FAULT_STATE": str(faulted / "faults")}
    assert _cli(faulted, tiny_model_dir, teacher_dir, "trainer.save_freq=1", *loss, env=env).returncode == -9
    assert (faulted / "run" / "latest_checkpointed_iteration.txt").read_text() == "2"
    result = _cli(faulted, tiny_model_dir, teacher_dir, "trainer.save_freq=1", *loss, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    a, b = _weights(straight / "run" / "global_step_3"), _weights(faulted / "run" / "global_step_3")
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
