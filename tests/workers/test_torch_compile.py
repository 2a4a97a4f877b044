"""model.use_torch_compile: decoder layers with compiled MLPs and norms give the eager log-probs and update."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm, compile_decoder_layers
from hybrid_rl.workers.config import FSDPConfig, ModelConfig
from hybrid_rl.workers.fsdp_utils import decoder_layers
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, ppo_batch


def test_the_switch_compiles_every_decoder_layer_and_nothing_else(tiny_model_dir):
    model = build_causal_lm(ModelConfig(path=tiny_model_dir, use_torch_compile=True), tiny_model_dir,
                            FSDPConfig(), torch.device("cpu"), trainable=True)
    layers = decoder_layers(model)
    assert layers and all(hasattr(layer.mlp.forward, "_torchdynamo_orig_callable") and
                          hasattr(layer.input_layernorm.forward, "_torchdynamo_orig_callable") for layer in layers)
    # attention reads the packed layout, a Python object: compiling it would recompile per micro-batch
    assert not any(hasattr(layer.self_attn.forward, "_torchdynamo_orig_callable") for layer in layers)
    assert not hasattr(model.forward, "_torchdynamo_orig_callable")
    plain = build_causal_lm(ModelConfig(path=tiny_model_dir), tiny_model_dir, FSDPConfig(), torch.device("cpu"),
                            trainable=True)
    assert not any(hasattr(layer.mlp.forward, "_torchdynamo_orig_callable") for layer in decoder_layers(plain))


def test_compiled_layers_give_the_eager_log_probs_and_update(tiny_model_dir):
    # aot_eager: dynamo's graphs and AOT autograd as in production, without inductor's C++ build time
    eager = load_causal_lm(tiny_model_dir)
    compiled = compile_decoder_layers(copy.deepcopy(eager), backend="aot_eager")
    start = [p.detach().clone() for p in eager.parameters()]
    data = ppo_batch(eager)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    # SGD: the update is linear in the gradient. AdamW's m / sqrt(v) turns a last-bit gradient
    # difference on an element whose gradient is near eps into up to lr (seen: 1.6e-4 on one of 32768
    # elements on an AVX-512 Xeon), which says nothing about the compiled layers.
    actors = [DataParallelPPOActor(actor_config(ppo_micro_batch_size_per_gpu=4), m,
                                   torch.optim.SGD(m.parameters(), lr=1e-1), use_remove_padding=True)
              for m in (eager, compiled)]
    (lp_e, _), (lp_c, _) = (a.compute_log_prob(data) for a in actors)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(lp_c[mask], lp_e[mask], atol=1e-5, rtol=0)
    metrics = [a.update_policy(data) for a in actors]
    assert metrics[1]["actor/grad_norm"][0] == pytest.approx(metrics[0]["actor/grad_norm"][0], rel=1e-4)
    moved = False
    for p_e, p_c, p_0 in zip(eager.parameters(), compiled.parameters(), start):
        torch.testing.assert_close(p_c, p_e, atol=1e-5, rtol=0)
        moved |= bool((p_e - p_0).abs().max() > 1e-4)
    assert moved  # the update did change the weights
