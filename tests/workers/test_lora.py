"""LoRA actor (peft): a fresh adapter is the base model, only adapters train, the reference is the
base with the adapter disabled (bit-identical to a separately loaded base), the merged weights the
rollout receives equal peft's merge, and a 2-rank FSDP2 update equals the 1-rank one."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm, build_optimizer
from hybrid_rl.workers.config import FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig
from hybrid_rl.workers.fsdp_utils import iter_full_state
from hybrid_rl.workers.lora import apply_lora, is_lora_model, merged_lora_weights, reference_context
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.dist_helpers import run_ranks
from tests.workers.helpers import actor_config, ppo_batch

FP32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))
COMMON = dict(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.01, ppo_micro_batch_size_per_gpu=2)
CPU = torch.device("cpu")


def _lora_config(model_dir: str, rank: int = 4, targets="all-linear") -> ModelConfig:
    return ModelConfig(path=model_dir, lora_rank=rank, lora_alpha=8, target_modules=targets)


def _prepared_batch(model):
    data = ppo_batch(model)
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    return data


def _updated_lora_actor(model_dir: str, data, steps: int = 2):
    model = build_causal_lm(_lora_config(model_dir), model_dir, FP32, CPU, trainable=True)
    optimizer = build_optimizer(model, OptimConfig(lr=5e-2))
    actor = DataParallelPPOActor(actor_config(**COMMON), model, optimizer, use_remove_padding=True)
    for _ in range(steps):
        actor.update_policy(data)
    return model, optimizer, actor


def test_fresh_adapter_leaves_the_outputs_unchanged(tiny_model_dir):
    base = load_causal_lm(tiny_model_dir)
    lora = apply_lora(load_causal_lm(tiny_model_dir), _lora_config(tiny_model_dir))
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(base(input_ids=ids).logits, lora(input_ids=ids).logits)


def test_only_adapters_train_and_hold_optimizer_state(tiny_model_dir):
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    model, optimizer, _ = _updated_lora_actor(tiny_model_dir, data)
    base = load_causal_lm(tiny_model_dir).state_dict()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    state_params = {id(p) for p in optimizer.state}
    assert state_params == {id(p) for n, p in model.named_parameters() if n in trained}
    for name, tensor in model.state_dict().items():
        if "lora_" not in name:  # every base weight is untouched
            assert torch.equal(tensor, base[name.removeprefix("base_model.model.").replace(".base_layer.", ".")]), name
    assert any(p.abs().max() > 0 for n, p in model.named_parameters() if ".lora_B." in n)


def test_reference_is_the_base_model_bit_for_bit(tiny_model_dir):
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    model, _, actor = _updated_lora_actor(tiny_model_dir, data)
    separate = build_causal_lm(ModelConfig(path=tiny_model_dir), tiny_model_dir, FP32, CPU, trainable=True)
    expected, _ = DataParallelPPOActor(actor_config(**COMMON), separate, use_remove_padding=True).compute_log_prob(data)
    with reference_context(model):
        reference, _ = actor.compute_log_prob(data)
    policy, _ = actor.compute_log_prob(data)
    assert torch.equal(reference, expected)
    assert (policy - expected).abs().max() > 1e-3  # the adapter does change the policy


def test_merged_weights_equal_peft_merge(tiny_model_dir):
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    model, _, _ = _updated_lora_actor(tiny_model_dir, data)
    merged = dict(merged_lora_weights(iter_full_state(model), model))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(merged[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
    bf16 = dict(merged_lora_weights(iter_full_state(model), model, torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_a_target_module_the_model_lacks_is_one_line(tiny_model_dir):
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.target_modules=\['qkv_fused'\] is invalid: .*"
                                         r"Fix: use all-linear"):
        build_causal_lm(_lora_config(tiny_model_dir, targets=["qkv_fused"]), tiny_model_dir, FP32, CPU, trainable=True)


def _lora_update_job(rank, world, model_dir, data, out_path):
    model = build_causal_lm(_lora_config(model_dir), model_dir, FP32, CPU, trainable=True)
    assert is_lora_model(model)
    actor = DataParallelPPOActor(actor_config(**COMMON), model, torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=5e-2),
        ppo_mini_batch_size_per_gpu=8 // world, use_remove_padding=True,
        fused_head=world == 2)  # the regular head on one rank, the fused one (the default) on two
    metrics = actor.update_policy(data.chunk(world)[rank])
    merged = dict(merged_lora_weights(iter_full_state(model), model))  # collective
    if rank == 0:
        torch.save({"merged": merged, "grad_norm": metrics["actor/grad_norm"][0]}, out_path)


def test_two_rank_lora_update_equals_one_rank(tiny_model_dir, tmp_path):
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    run_ranks(_lora_update_job, 1, tiny_model_dir, data, str(tmp_path / "one.pt"))
    run_ranks(_lora_update_job, 2, tiny_model_dir, data, str(tmp_path / "two.pt"))
    one, two = (torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in ("one", "two"))
    assert one["merged"].keys() == two["merged"].keys()
    for name in one["merged"]:
        torch.testing.assert_close(two["merged"][name], one["merged"][name], atol=1e-5, rtol=0, msg=name)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    base = load_causal_lm(tiny_model_dir).state_dict()
    assert max((one["merged"][k] - base[k]).abs().max().item() for k in base) > 1e-4  # it trained


def _bf16_ref_then_update_job(rank, world, model_dir, data, ref_first, out_path):
    bf16 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16"))
    model = build_causal_lm(_lora_config(model_dir), model_dir, bf16, CPU, trainable=True)
    actor = DataParallelPPOActor(actor_config(**COMMON), model, build_optimizer(model, OptimConfig(lr=1e-3)),
                                 use_remove_padding=True)
    if ref_first:  # the worker's step order: the reference pass is the FSDP2 module's first forward
        with reference_context(model):
            actor.compute_log_prob(data)
    torch.save(actor.update_policy(data)["actor/grad_norm"][0], out_path)


def test_reference_pass_first_under_fsdp2_bf16_leaves_the_update_intact(tiny_model_dir, tmp_path):
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    for ref_first in (False, True):
        run_ranks(_bf16_ref_then_update_job, 1, tiny_model_dir, data, ref_first, str(tmp_path / f"{ref_first}.pt"))
    norms = [torch.load(tmp_path / f"{flag}.pt") for flag in (False, True)]
    assert norms[0] == norms[1] and norms[0] > 0


def test_a_target_the_merge_cannot_take_is_one_line(tiny_model_dir):
    with pytest.raises(ValueError, match=r"target_modules=\['embed_tokens'\] is invalid: model.embed_tokens cannot "
                                         r"be merged"):
        build_causal_lm(_lora_config(tiny_model_dir, targets=["embed_tokens"]), tiny_model_dir, FP32, CPU,
                        trainable=True)


def _bf16_reference_job(rank, world, model_dir, data, out_path):
    bf16 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16"))
    lora = build_causal_lm(_lora_config(model_dir), model_dir, bf16, CPU, trainable=True)
    ref = build_causal_lm(ModelConfig(path=model_dir), model_dir, bf16, CPU, trainable=False)
    config = actor_config(**COMMON)
    shard = data.chunk(world)[rank]
    with reference_context(lora):
        from_lora, _ = DataParallelPPOActor(config, lora, use_remove_padding=True).compute_log_prob(shard)
    separate, _ = DataParallelPPOActor(config, ref, use_remove_padding=True).compute_log_prob(shard)
    base_dtypes = sorted({str(p.dtype) for p in lora.parameters() if not p.requires_grad})
    torch.save({"equal": torch.equal(from_lora, separate), "base_dtypes": base_dtypes}, f"{out_path}.{rank}")


@pytest.mark.parametrize("world", [1, 2])
def test_reference_equals_the_separate_reference_under_fsdp2_bf16(tiny_model_dir, tmp_path, world):
    """In the production dtype: the LoRA base is stored in bf16 like the separate frozen reference,
    and its log-probs with the adapters off are bit-identical to that reference's, on 1 and 2 ranks."""
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    run_ranks(_bf16_reference_job, world, tiny_model_dir, data, str(tmp_path / "res"))
    for rank in range(world):
        res = torch.load(tmp_path / f"res.{rank}")
        assert res["equal"] and res["base_dtypes"] == ["torch.bfloat16"], res
