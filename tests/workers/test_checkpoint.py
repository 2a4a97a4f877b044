"""Worker checkpoints: exact round trips (params, optimizer, LR scheduler, RNG), atomicity, world size."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hybrid_rl.workers import checkpoint as ckpt
from hybrid_rl.workers.builders import build_causal_lm, build_lr_scheduler, build_optimizer
from hybrid_rl.workers.config import FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig
from hybrid_rl.workers.fsdp_utils import full_state_dict
from hybrid_rl.workers.model_loader import load_causal_lm, load_tokenizer
from tests.workers.dist_helpers import run_ranks

OPTIM = OptimConfig(lr=1e-2, lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1)
FP32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))


def _trained(model_dir, fsdp: bool = False):
    """Model + AdamW + cosine schedule after two steps on a fixed loss."""
    if fsdp:
        model = build_causal_lm(ModelConfig(path=model_dir), model_dir, FP32, torch.device("cpu"),
                                trainable=True)
    else:
        model = load_causal_lm(model_dir)
    optimizer = build_optimizer(model, OPTIM)
    scheduler = build_lr_scheduler(optimizer, OPTIM, key="actor.optim", total_training_steps=10)
    ids = torch.arange(3, 19).reshape(2, 8)
    for _ in range(2):
        model(input_ids=ids).logits.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def _draws():
    return (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])


def _assert_draws_equal(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_round_trip_restores_everything_exactly(tiny_model_dir, tmp_path, state_dict_type):
    model, optimizer, scheduler = _trained(tiny_model_dir)
    path = str(tmp_path / "actor")
    ckpt.save_checkpoint(path, model=model, optimizer=optimizer, lr_scheduler=scheduler,
                         hf_config=model.config, tokenizer=load_tokenizer(tiny_model_dir),
                         state_dict_type=state_dict_type, global_step=2)
    expected_draws = _draws()
    params = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = {id(p): optimizer.state[p]["exp_avg"].clone() for p in model.parameters()}

    fresh, fresh_opt, fresh_sched = _trained(tiny_model_dir)  # different state: 2 more steps
    fresh_opt.step()
    _draws()
    meta = ckpt.load_checkpoint(path, model=fresh, optimizer=fresh_opt, lr_scheduler=fresh_sched)
    assert meta["global_step"] == 2 and meta["world_size"] == 1
    _assert_draws_equal(_draws(), expected_draws)
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, params[name], rtol=0, atol=0)
    for p_old, p_new in zip(model.parameters(), fresh.parameters()):
        torch.testing.assert_close(fresh_opt.state[p_new]["exp_avg"], exp_avg[id(p_old)], rtol=0, atol=0)
        assert float(fresh_opt.state[p_new]["step"]) == 2.0
    assert fresh_sched.last_epoch == scheduler.last_epoch == 2
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()
    # the HF part is a loadable config + tokenizer
    hf = Path(path) / "huggingface"
    assert json.loads((hf / "config.json").read_text())["model_type"] == "llama"
    assert load_tokenizer(str(hf)).eos_token_id == 2


def test_hf_model_content_writes_a_loadable_hf_folder(tiny_model_dir, tmp_path):
    model, _, _ = _trained(tiny_model_dir)
    path = tmp_path / "actor"
    ckpt.save_checkpoint(str(path), model=model, hf_config=model.config,
                         tokenizer=load_tokenizer(tiny_model_dir), contents=("model", "hf_model"))
    reloaded = load_causal_lm(str(path / "huggingface"))
    for name, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, model.state_dict()[name], rtol=0, atol=0)


def test_interrupted_save_keeps_the_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    model, optimizer, scheduler = _trained(tiny_model_dir)
    path = str(tmp_path / "actor")
    ckpt.save_checkpoint(path, model=model, optimizer=optimizer, lr_scheduler=scheduler, global_step=1)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_save_extra", crash)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(path, model=model, optimizer=optimizer, lr_scheduler=scheduler, global_step=2)
    assert ckpt.read_checkpoint_meta(path)["global_step"] == 1  # the old one is intact
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        ckpt.read_checkpoint_meta(path + ".tmp")


def _two_rank_checkpoint_job(rank, world, model_dir, root):
    model, optimizer, scheduler = _trained(model_dir, fsdp=True)
    for kind in ("sharded", "full"):
        ckpt.save_checkpoint(f"{root}/{kind}", model=model, optimizer=optimizer, lr_scheduler=scheduler,
                             state_dict_type=kind, global_step=2)
    full = full_state_dict(model)
    local_params = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    local_avg = [optimizer.state[p]["exp_avg"].to_local().clone() for p in model.parameters()]
    for kind in ("sharded", "full"):
        fresh, fresh_opt, fresh_sched = _trained(model_dir, fsdp=True)
        fresh_opt.step()
        ckpt.load_checkpoint(f"{root}/{kind}", model=fresh, optimizer=fresh_opt, lr_scheduler=fresh_sched)
        for name, value in fresh.state_dict().items():
            assert torch.equal(value.to_local(), local_params[name]), (kind, name)
        for p, avg in zip(fresh.parameters(), local_avg):
            assert torch.equal(fresh_opt.state[p]["exp_avg"].to_local(), avg), kind
    if rank == 0:
        from safetensors.torch import save_file
        save_file({k: v.contiguous().clone() for k, v in full.items()}, f"{root}/gathered.safetensors")


def test_two_rank_checkpoints_and_world_size_change(tiny_model_dir, tmp_path):
    run_ranks(_two_rank_checkpoint_job, 2, tiny_model_dir, str(tmp_path))
    from safetensors.torch import load_file
    gathered = load_file(str(tmp_path / "gathered.safetensors"))
    model = load_causal_lm(tiny_model_dir)
    with pytest.raises(ValueError, match="same worker count"):
        ckpt.load_checkpoint(str(tmp_path / "sharded"), model=model)
    # a full checkpoint reloads on one worker (model only: RNG streams are per worker)
    ckpt.load_checkpoint(str(tmp_path / "full"), model=model, contents=("model",))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, gathered[name], rtol=0, atol=0)
