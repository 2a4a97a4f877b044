"""The LoRA actor through the CLI: GRPO with the KL loss on 2 FSDP2 workers (the reference is the
actor's base), both rollout engines fed merged weights, and a worker killed mid-run resuming to the
same weights as an uninterrupted run."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from test_e2e import REPO, _assert_ok, _overrides, _rows, _run_cli, _weights

pytestmark = pytest.mark.slow

LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1")
NO_VAL = ("trainer.val_before_train=false", "trainer.val_at_end=false")


def _length_reward(tmp_path) -> tuple[str, str]:
    """A reward a random tiny model gets signal from (the arithmetic rule scores it 0 everywhere,
    which leaves GRPO's advantages and so every gradient at 0)."""
    path = tmp_path / "length_reward.py"
    path.write_text("def length_bonus(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return len(solution_str) / 100.0\n")
    return f"custom_reward_function.path={path}", "custom_reward_function.name=length_bonus"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir):
    """One uninterrupted 3-step LoRA run (validation at the end only), shared by the tests below."""
    root = tmp_path_factory.mktemp("lora_run")
    _assert_ok(_run_cli(root, tiny_model_dir, *LORA, *_length_reward(root), "trainer.val_before_train=false"))
    return root


def test_grpo_lora_two_workers_trains_only_adapters_and_exports(lora_run, tiny_model_dir):
    run = lora_run / "run"
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["actor/kl_loss"]) for r in rows)  # the ref log-probs exist
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == reference (B = 0)
    assert rows[-1]["actor/kl_loss"] > 1e-6  # later the adapted policy has moved away from the base
    first, last = _weights(run / "global_step_1"), _weights(run / "global_step_3")
    changed = {k.split(":", 1)[1] for k in first if not torch.equal(first[k], last[k])}
    assert any(".lora_B." in k for k in changed) and all(".lora_A." in k or ".lora_B." in k for k in changed)
    log = (run / "logs" / "worker_0.log").read_text()
    assert "precision on" not in log and "rank 0/2 joined" in log  # the worker writes its own log file
    _exports_reproduce_the_last_validation(lora_run, tiny_model_dir)


def _exports_reproduce_the_last_validation(tmp_path, base_dir):
    """The merged HF folder and the PEFT adapter on the base model both greedily reproduce the
    responses the rollout engine (fed merged weights) gave at the last validation."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid_rl.data import RLHFDataset
    from hybrid_rl.model_merger import main as merge

    run = tmp_path / "run"
    merge(["--local_dir", str(run / "global_step_3" / "actor"), "--target_dir", str(tmp_path / "hf")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "hf" / "lora_adapter")
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    final = [s for s in map(json.loads, open(run / "val_generations.jsonl")) if s["step"] == 3]
    dataset = RLHFDataset(str(next((tmp_path / "data").glob("arithmetic-*/test.parquet"))), tok, max_prompt_length=160)
    assert final
    for i, sample in enumerate(final):
        ids = dataset[i]["input_ids"][None, :]
        torch.testing.assert_close(adapter(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
        out = merged.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == sample["response"]


@pytest.mark.vllm
def test_grpo_lora_with_the_vllm_rollout(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    overrides = [o for o in _overrides(tmp_path, tiny_model_dir, *LORA, *NO_VAL, *_length_reward(tmp_path),
                                       "trainer.total_training_steps=2",
                                       "trainer.n_gpus_per_node=1")
                 if o not in ("actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2",
                              "trainer.total_training_steps=3")]
    overrides += ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.cpu_kvcache_space_gib=1"]
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=900)
    _assert_ok(result)
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["timing_s/weight_sync"] > 0
    assert rows[-1]["rollout/lora_sync_merged"] == 1.0


def test_lora_run_killed_mid_update_resumes_to_the_same_weights(tmp_path, tiny_model_dir, lora_run):
    """A worker killed in step 2's update restarts and ends with the weights of the uninterrupted run
    (its end-of-run validation changes no weight)."""
    reward = _length_reward(tmp_path)
    env = {"HYBRID_RL_FAULT": "kill:update_actor:2:1", "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, *LORA, *NO_VAL, *reward, "trainer.max_restarts=1", env=env))
    a, b = _weights(lora_run / "run" / "global_step_3"), _weights(tmp_path / "run" / "global_step_3")
    assert a.keys() == b.keys() and any(".lora_B." in k and a[k].abs().max() > 0 for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
