"""fsdp_config.layer_wrap: FSDP2 per decoder layer or on the root alone, the same numbers either way."""

from __future__ import annotations

import pytest
import torch

from hybrid_rl.workers.config import FSDPConfig, MixedPrecisionConfig
from hybrid_rl.workers.fsdp_utils import ROOT_WRAP_MAX_MEMORY_FRAC, root_wrap_bytes, wraps_layers
from tests.workers.dist_helpers import run_ranks


def test_an_unknown_layer_wrap_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"fsdp_config.layer_wrap='layers' is invalid: must be one of "
                                         r"\['auto', 'per_layer', 'root'\]. Fix: use auto"):
        FSDPConfig(layer_wrap="layers")


def _bf16(**kwargs) -> FSDPConfig:
    return FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16"), **kwargs)


def test_root_wrap_bytes_count_the_copy_its_gradients_and_the_reduce_buffers():
    model = torch.nn.Linear(10, 10)  # 110 parameters
    cuda = torch.device("cuda")
    assert root_wrap_bytes(model, _bf16(), cuda) == 110 * (2 * 2 + 2 * 4)  # bf16 copy + grads, fp32 reduce in/out
    fp32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))
    assert root_wrap_bytes(model, fp32, cuda) == 110 * 16
    model.weight.requires_grad_(False)  # a frozen base (LoRA): its copy only, no gradient or reduce buffers
    assert root_wrap_bytes(model, _bf16(), cuda) == 110 * 2 + 10 * (2 + 2 * 4)


def test_auto_wraps_the_root_alone_only_on_one_cuda_rank_with_a_small_transient(monkeypatch):
    model = torch.nn.Linear(10, 10)  # 110 parameters: 1320 transient bytes under one bf16 group
    memory = {"total": 0}

    class Properties:
        @property
        def total_memory(self):
            return memory["total"]

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    memory["total"] = 1320 / ROOT_WRAP_MAX_MEMORY_FRAC  # exactly 5% of the GPU
    assert not wraps_layers(model, _bf16(), cuda, world_size=1)
    assert wraps_layers(model, _bf16(), cuda, world_size=2)  # sharding needs the layers
    assert wraps_layers(model, _bf16(param_offload=True), cuda, world_size=1)
    assert wraps_layers(model, _bf16(), cpu, world_size=1)  # host memory is the scarce thing there
    memory["total"] = 1319 / ROOT_WRAP_MAX_MEMORY_FRAC  # one byte too small a GPU
    assert wraps_layers(model, _bf16(), cuda, world_size=1)
    assert not wraps_layers(model, _bf16(layer_wrap="root"), cpu, world_size=4)  # as named
    assert wraps_layers(model, _bf16(layer_wrap="per_layer"), cuda, world_size=1)


def _train(model_dir: str, layer_wrap: str, param_dtype: str) -> tuple[dict, int]:
    """Two optimizer steps of two micro-batches each; the full weights and FSDP2's group count."""
    from torch.distributed.fsdp import FSDPModule

    from hybrid_rl.workers.fsdp_utils import apply_fsdp2
    from hybrid_rl.workers.model_loader import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(model_dir, dtype="float32")
    config = FSDPConfig(layer_wrap=layer_wrap, mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype))
    apply_fsdp2(model, config, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        for micro in (ids[:1], ids[1:]):
            model(input_ids=micro).logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    return weights, sum(isinstance(m, FSDPModule) for m in model.modules())


def _compare(rank: int, world_size: int, model_dir: str) -> None:
    from hybrid_rl.workers.fsdp_utils import decoder_layers
    from hybrid_rl.workers.model_loader import load_causal_lm

    layers = len(decoder_layers(load_causal_lm(model_dir, dtype="float32")))
    for param_dtype in ("float32", "bfloat16"):
        per_layer, groups = _train(model_dir, "per_layer", param_dtype)
        assert groups == layers + 1
        root, groups = _train(model_dir, "root", param_dtype)
        assert groups == 1
        assert per_layer.keys() == root.keys()
        assert all(torch.equal(per_layer[k], root[k]) for k in root), param_dtype  # bit for bit


def test_root_alone_trains_bit_for_bit_as_per_layer(tiny_model_dir):
    run_ranks(_compare, 1, str(tiny_model_dir))


def _gathered(model: torch.nn.Module) -> int:
    """Parameters FSDP2 holds gathered (sharded ones are DTensors)."""
    from torch.distributed.tensor import DTensor

    return sum(not isinstance(p, DTensor) for p in model.parameters())


def _no_grad_passes_release(rank: int, world_size: int, model_dir: str) -> None:
    from hybrid_rl.workers.actor import DataParallelPPOActor
    from hybrid_rl.workers.config import CriticConfig
    from hybrid_rl.workers.critic import DataParallelPPOCritic
    from hybrid_rl.workers.fsdp_utils import apply_fsdp2
    from hybrid_rl.workers.model_loader import load_causal_lm, load_value_model
    from tests.workers.helpers import actor_config, make_batch

    model = apply_fsdp2(load_causal_lm(model_dir, dtype="float32"), FSDPConfig(layer_wrap="root"),
                        torch.device("cpu"))
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]))
    assert _gathered(model) > 0  # the root keeps its copy after a forward, waiting for a backward
    data = make_batch()
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False, max_token_len=None)
    DataParallelPPOActor(actor_config(), model).compute_log_prob(data)
    assert _gathered(model) == 0  # ... which the old log-prob pass never runs
    critic_model = apply_fsdp2(load_value_model(model_dir), FSDPConfig(layer_wrap="root"), torch.device("cpu"))
    critic = DataParallelPPOCritic(CriticConfig(ppo_mini_batch_size=8, rollout_n=1, ppo_micro_batch_size_per_gpu=3),
                                   critic_model)
    critic.compute_values(make_batch())
    assert _gathered(critic_model) == 0
    kept = FSDPConfig(layer_wrap="per_layer", reshard_after_forward=False)  # every layer keeps its copy
    layered = apply_fsdp2(load_causal_lm(model_dir, dtype="float32"), kept, torch.device("cpu"))
    DataParallelPPOActor(actor_config(), layered).compute_log_prob(data)
    assert _gathered(layered) == 0


def test_no_grad_passes_release_every_gathered_copy(tiny_model_dir):
    run_ranks(_no_grad_passes_release, 1, str(tiny_model_dir))
