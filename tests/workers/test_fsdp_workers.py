"""The Ray worker shells end to end on 2 CPU workers (gloo): colocated actor+rollout+ref and critic.

One module-scoped group (start-up dominates the cost); the steps run in order:
generate -> log-probs (vs HF) -> ref -> critic -> update -> generate with the new weights -> checkpoint.
"""

from __future__ import annotations

import pytest
import ray
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,
                                         create_colocated_worker_cls, init_ray)
from hybrid_rl.workers import ActorRolloutRefWorker, CriticWorker
from hybrid_rl.workers.config import (ActorConfig, ActorRolloutRefConfig, CriticConfig, CriticModelConfig,
                                      FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig, RefConfig)
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.rollout.config import RolloutConfig
from tests.workers.helpers import hf_response_log_probs, make_batch

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
FP32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))


def _configs(model_dir):
    model = ModelConfig(path=model_dir)
    actor = ActorConfig(ppo_mini_batch_size=2, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=1, use_kl_loss=True,
                        optim=OptimConfig(lr=5e-2), fsdp_config=FP32, grad_clip=None)
    rollout = RolloutConfig(name="hf", n=2, temperature=1.0, response_length=4, prompt_length=6,
                            dtype="float32", calculate_log_probs=True)
    arr = ActorRolloutRefConfig(model=model, actor=actor, rollout=rollout,
                                ref=RefConfig(log_prob_use_dynamic_bsz=False, log_prob_micro_batch_size_per_gpu=2,
                                              fsdp_config=FP32))
    critic = CriticConfig(model=CriticModelConfig(path=model_dir, fsdp_config=FP32), rollout_n=2,
                          ppo_mini_batch_size=2, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2,
                          optim=OptimConfig(lr=1e-3))
    return arr, critic


@pytest.fixture(scope="module")
def views(tiny_model_dir):
    assert not ray.is_initialized()
    init_ray(num_cpus=2)
    arr, critic = _configs(tiny_model_dir)
    cls = create_colocated_worker_cls({
        "actor_rollout": RayClassWithInitArgs(ActorRolloutRefWorker, config=arr, role="actor_rollout_ref",
                                              total_training_steps=4),
        "critic": RayClassWithInitArgs(CriticWorker, config=critic, total_training_steps=4)})
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=1)
    group = RayWorkerGroup(pool, cls, call_timeout_s=300)
    spawned = group.spawn(["actor_rollout", "critic"])
    spawned["critic"].init_model()
    spawned["actor_rollout"].init_model()
    yield spawned
    group.shutdown()
    pool.remove()
    ray.shutdown()


def _prompts():
    data = make_batch(num_rows=4, prompt_len=6)
    b = data.batch
    return DataProto.from_dict({k: b[k][:, :6] for k in ("input_ids", "attention_mask", "position_ids")},
                               meta_info={"eos_token_id": 2, "pad_token_id": 0, "seed": 7})


def _merge(batch, output):
    """Union without the per-call metrics (the trainer reduces those separately)."""
    output.meta_info.pop("metrics", None)
    return batch.union(output)


def _with_advantages(rollout_out):
    g = torch.Generator().manual_seed(0)
    mask = rollout_out.batch["response_mask"].float()
    rollout_out.batch["advantages"] = torch.randn(mask.shape, generator=g) * mask
    return rollout_out


def test_actor_rollout_ref_and_critic_round(views, tiny_model_dir, tmp_path_factory):
    wg, critic = views["actor_rollout"], views["critic"]
    base = load_causal_lm(tiny_model_dir)
    out = wg.generate_sequences(_prompts())
    assert out.batch["responses"].shape == (4, 4) and "timing_s/weight_sync" in out.meta_info["metrics"]

    # old_log_probs = plain HF forward; the fp32 rollout's own log-probs agree (same weights)
    lp = wg.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    expected = hf_response_log_probs(base, out, temperature=1.0)
    torch.testing.assert_close(lp.batch["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
    out = _merge(out, lp)
    out = _merge(out, wg.compute_ref_log_prob(out))
    torch.testing.assert_close(out.batch["ref_log_prob"][mask], expected[mask], atol=1e-5, rtol=0)

    values = critic.compute_values(out).batch["values"]
    assert values.shape == (4, 4)
    out.batch["values"] = values
    out.batch["returns"] = torch.ones(4, 4) * out.batch["response_mask"]
    critic_metrics = critic.update_critic(out).meta_info["metrics"]
    assert {"critic/vf_loss", "critic/grad_norm", "critic/lr"} <= set(critic_metrics)

    out = _with_advantages(out)
    metrics = wg.update_actor(out).meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss",
                "actor/grad_norm", "actor/lr", "perf/peak_rss_gib/update_actor"):
        assert key in metrics, key
    _check_memory_breakdown(wg, base)

    # The next generation samples from the updated weights: the rollout's log-probs of its own
    # samples equal the updated actor's, and differ from the initial model's.
    out2 = wg.generate_sequences(_prompts())
    new_lp = wg.compute_log_prob(out2).batch["old_log_probs"]
    mask2 = out2.batch["response_mask"].bool()
    torch.testing.assert_close(out2.batch["rollout_log_probs"][mask2], new_lp[mask2], atol=1e-4, rtol=0)
    initial = hf_response_log_probs(base, out2, temperature=1.0)
    assert (initial[mask2] - new_lp[mask2]).abs().max() > 1e-2
    ref_after = wg.compute_ref_log_prob(out2).batch["ref_log_prob"]
    torch.testing.assert_close(ref_after[mask2], initial[mask2], atol=1e-5, rtol=0)  # ref stays frozen

    # checkpoint round trip through the workers
    path = str(tmp_path_factory.mktemp("ckpt") / "actor")
    wg.save_checkpoint(path, global_step=1)
    out2 = _merge(_merge(out2, wg.compute_log_prob(out2)), wg.compute_ref_log_prob(out2))
    wg.update_actor(_with_advantages(out2))
    assert not torch.allclose(wg.compute_log_prob(out2).batch["old_log_probs"][mask2], new_lp[mask2])
    wg.load_checkpoint(path)
    restored = wg.compute_log_prob(out2).batch["old_log_probs"]
    torch.testing.assert_close(restored[mask2], new_lp[mask2], atol=0, rtol=0)


def _check_memory_breakdown(wg, base):
    """Each rank's owners, counted from its live tensors: an FSDP2 shard of the fp32 actor and of
    the fp32 reference, AdamW's two fp32 moments (+ a 4-byte step) per sharded parameter, the
    gradients held at the optimizer step, and the hf rollout's whole fp32 copy."""
    from hybrid_rl.utils.memory import module_bytes

    full = sum(p.numel() for p in base.parameters()) * 4
    for owners in wg.memory_breakdown():  # one dict per rank (2 ranks)
        shard = owners["actor/grads"]
        assert 0.4 * full < shard < 0.6 * full
        assert owners["actor/optimizer"] == 2 * shard + 4 * len(list(base.parameters()))
        assert shard <= owners["actor/params"] < shard + 0.05 * full  # + unsharded buffers (rotary)
        assert 0.4 * full < owners["ref/params"] < 0.65 * full
        assert owners["rollout/weights"] == module_bytes(base)
        assert owners["process/rss"] > owners["process/baseline_rss"] > 0
