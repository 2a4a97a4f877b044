"""Adapters-only pushes of a LoRA actor: the first push writes the base once, later ones only the A/B
factors (bytes counted by hand), and what the receiver loads equals the merged push bit for bit, in
both engines (same greedy tokens and log-probs), also after the first push was released and in a
fresh engine (one that lost its weights); the worker resends the base only after its exports closed."""

import os
from types import SimpleNamespace

import pytest
import torch

from hybrid_rl.workers.config import ModelConfig
from hybrid_rl.workers.lora import (apply_lora, lora_adapter_weights, lora_base_weights, lora_push_config,
                                    merged_lora_weights)
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.weight_transfer import WeightExporter, export_lora, open_weights, rollout_aliases
from tests.workers.test_weight_transfer_engines import _greedy

_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
RANK, ALPHA = 4, 8


def _lora_model(model_dir: str, seed: int = 1, targets="all-linear"):
    model = apply_lora(load_causal_lm(model_dir), ModelConfig(path=model_dir, lora_rank=RANK, lora_alpha=ALPHA,
                                                             target_modules=targets))
    _train_adapters(model, seed)
    return model


def _train_adapters(model, seed: int) -> None:
    """Non-zero adapters, as after some updates (a fresh lora_B is 0 and would hide a missing merge)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(0.2 * torch.randn(param.shape, generator=gen))


def _push(exporter, model, dtype, with_base: bool):
    base = lora_base_weights(iter(model.state_dict().items()), model, dtype) if with_base else None
    return export_lora(exporter, lora_adapter_weights(model), base, rollout_aliases(model),
                       lora_push_config(model, dtype), "shm", bucket_bytes=64 << 10)


def _merged(model, dtype) -> dict[str, torch.Tensor]:
    return dict(merged_lora_weights(iter(model.state_dict().items()), model, dtype))


def _loaded(handle) -> dict[str, torch.Tensor]:
    with open_weights(handle) as named:
        return {name: tensor.clone() for name, tensor in named}


@pytest.fixture
def exporter(tmp_path):
    exporter = WeightExporter(str(tmp_path))
    yield exporter
    exporter.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adapters_only_pushes_load_the_merged_weights(tiny_model_dir, exporter, dtype):
    model = _lora_model(tiny_model_dir)
    first = _push(exporter, model, dtype, with_base=True)
    assert first.lora.carries_base and first.lora.r == RANK and first.lora.lora_alpha == ALPHA
    assert dict(first.lora.scalings) and set(dict(first.lora.scalings).values()) == {ALPHA / RANK}
    loaded, merged = _loaded(first), _merged(model, dtype)
    assert list(loaded) == list(merged)
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in merged.items())
    exporter.release(first)  # the base stays pinned
    _train_adapters(model, seed=2)
    second = _push(exporter, model, dtype, with_base=False)
    assert not second.lora.carries_base and second.lora.base == first.lora.base
    loaded, merged = _loaded(second), _merged(model, dtype)
    assert all(torch.equal(loaded[k], v) for k, v in merged.items())
    exporter.release(second)


def test_a_later_push_carries_the_factors_alone(tiny_model_dir, exporter):
    model = _lora_model(tiny_model_dir, targets=["q_proj", "v_proj"])
    _push(exporter, model, torch.float32, with_base=True)
    second = _push(exporter, model, torch.float32, with_base=False)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    q_out, v_out = config.hidden_size, config.num_key_value_heads * head_dim
    per_layer = RANK * (config.hidden_size + q_out) + RANK * (config.hidden_size + v_out)  # A [r, in] + B [out, r]
    assert second.num_bytes == 4 * per_layer * config.num_hidden_layers  # fp32 factors
    base = second.lora.base
    assert base.num_bytes == sum(p.numel() * 4 for n, p in model.named_parameters() if ".lora_" not in n)


def test_a_base_weight_the_rollout_dtype_cannot_hold_keeps_its_own(tiny_model_dir, exporter):
    model = _lora_model(tiny_model_dir, targets=["q_proj"])
    layer = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    with torch.no_grad():
        layer.weight.add_(1e-6)  # fp32 bits that bf16 drops
    handle = _push(exporter, model, torch.bfloat16, with_base=True)
    dtypes = {n: e.dtype for e in handle.lora.base.entries for n in e.names}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "float32"
    assert dtypes["model.layers.0.mlp.up_proj.weight"] == "bfloat16"
    loaded, merged = _loaded(handle), _merged(model, torch.bfloat16)
    assert all(torch.equal(loaded[k], v) for k, v in merged.items())


def test_bad_inputs_get_a_fix(tiny_model_dir, exporter):
    model = _lora_model(tiny_model_dir, targets=["q_proj"])
    with pytest.raises(ValueError, match="no base weights pinned for transport 'shm'"):
        _push(exporter, model, torch.float32, with_base=False)
    handle = _push(exporter, model, torch.float32, with_base=True)
    with pytest.raises(ValueError, match="is not alive in this exporter"):
        exporter.pin(handle.lora.base)  # pinned already: no longer a live push
    from hybrid_rl.workers.weight_transfer import apply_adapters

    with pytest.raises(ValueError, match="lacks 4 LoRA factors"):
        list(apply_adapters(iter([]), {}, handle.lora))


@pytest.mark.parametrize("name", ENGINES)
def test_engines_generate_as_with_the_merged_push(tiny_model_dir, exporter, name):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=name, dtype="float32", response_length=8, prompt_length=16, calculate_log_probs=True,
                        max_num_seqs=4, cpu_kvcache_space_gib=1, seed=0)
    model = _lora_model(tiny_model_dir)
    first = _push(exporter, model, torch.float32, with_base=True)
    exporter.release(first)
    _train_adapters(model, seed=3)
    later = _push(exporter, model, torch.float32, with_base=False)
    # A fresh engine, as after a restart, built as the decoupled rollout's (vLLM: its weight-transfer engine).
    engine = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu", weight_transfer=True)
    try:
        before = _greedy(engine).batch["responses"]
        engine.update_weights(iter(_merged(model, torch.float32).items()))
        merged = _greedy(engine).batch
        engine.update_weights(load_causal_lm(tiny_model_dir).state_dict().items())
        engine.load_weight_push(later)  # what load_rollout_weights calls
        pushed = _greedy(engine).batch
    finally:
        engine.shutdown()
    assert not torch.equal(merged["responses"], before)  # the adapters change the greedy tokens
    assert torch.equal(pushed["responses"], merged["responses"])
    assert torch.equal(pushed["rollout_log_probs"], merged["rollout_log_probs"])


def test_the_worker_sends_the_base_once_per_exporter(tiny_model_dir):
    from hybrid_rl.workers.fsdp_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)  # the export path only: no Ray, no FSDP
    worker.actor_module, worker._rank, worker.role = _lora_model(tiny_model_dir), 0, "actor"  # device: the CPU
    worker._is_actor, worker.config = True, SimpleNamespace(rollout=SimpleNamespace(dtype="float32"))
    try:
        handles = [worker.export_rollout_weights(transport="shm")["weights"] for _ in range(2)]
        assert [h.lora.carries_base for h in handles] == [True, False]
        worker.close_weight_exports()
        again = worker.export_rollout_weights(transport="shm")["weights"]
        assert again.lora.carries_base and again.lora.base.buckets != handles[0].lora.base.buckets
        assert dict(_loaded(again)).keys() == _merged(worker.actor_module, torch.float32).keys()
    finally:
        worker.close_weight_exports()


@pytest.mark.slow
def test_a_decoupled_lora_run_at_eta_zero_equals_the_synchronous_one(tmp_path, tiny_model_dir):
    """Adapters-only pushes (the decoupled mode) against merged in-process syncs (the synchronous
    mode): the same weights and grad norms after 3 steps, bit for bit."""
    from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli, _weights
    from tests.trainer.test_e2e_async import _async_args, _reward_args

    lora = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    sync_dir, async_dir = tmp_path / "sync", tmp_path / "async"
    for folder in (sync_dir, async_dir):
        folder.mkdir()
    _assert_ok(_run_cli(sync_dir, tiny_model_dir, *_reward_args(tmp_path), *lora, "ray_init.num_cpus=1"))
    _assert_ok(_run_cli(async_dir, tiny_model_dir, *_reward_args(tmp_path), *lora,
                        *_async_args("async_training.max_head_offpolicyness=0")))
    want, got = _weights(sync_dir / "run" / "global_step_3"), _weights(async_dir / "run" / "global_step_3")
    assert want and want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert any(".lora_B." in k and want[k].abs().sum() > 0 for k in want)  # the adapters trained
    sync_norms = {r["step"]: r["actor/grad_norm"] for r in _rows(sync_dir / "run")}
    assert {r["step"]: r["actor/grad_norm"] for r in _rows(async_dir / "run")} == sync_norms
