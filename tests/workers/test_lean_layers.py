"""model.use_lean_layers: RMSNorm and SwiGLU MLP forwards that save fewer activations, same math."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm, build_value_model
from hybrid_rl.workers.config import FSDPConfig, ModelConfig
from hybrid_rl.workers.fsdp_utils import decoder_layers
from hybrid_rl.workers.lean_layers import apply_lean_layers
from hybrid_rl.workers.lora import apply_lora
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, ppo_batch


def _saved_storages(fn, *inputs: torch.Tensor) -> dict[int, int]:
    """``{storage pointer: bytes}`` of every tensor autograd saves while running ``fn(*inputs)``."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return saved


def _layer(tiny_model_dir: str, dtype: str = "float32") -> nn.Module:
    torch.manual_seed(0)
    layer = decoder_layers(load_causal_lm(tiny_model_dir, dtype=dtype))[0]
    for p in layer.parameters():  # a trained-looking norm weight, not the all-ones init
        p.data.add_(0.1 * torch.randn_like(p))
    return layer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lean_forwards_are_bit_identical_to_the_hf_ones(tiny_model_dir, dtype):
    layer = _layer(tiny_model_dir, dtype)
    lean = copy.deepcopy(layer)
    assert apply_lean_layers(lean) == {"rms_norm": 2, "mlp": 1, "skipped": 0}
    x = torch.randn(3, 7, layer.mlp.gate_proj.in_features).to(getattr(torch, dtype))
    for name in ("input_layernorm", "post_attention_layernorm", "mlp"):
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                assert torch.equal(getattr(lean, name)(x), getattr(layer, name)(x)), (name, grad)


@pytest.mark.parametrize("name", ["input_layernorm", "mlp"])
def test_the_gradients_are_autograds_in_float64(tiny_model_dir, name):
    layer = _layer(tiny_model_dir).double()
    lean = copy.deepcopy(layer)
    apply_lean_layers(lean)
    x = torch.randn(2, 5, layer.mlp.gate_proj.in_features, dtype=torch.float64)
    weights = torch.randn_like(getattr(layer, name)(x))
    grads = []
    for module in (getattr(layer, name), getattr(lean, name)):
        xi = x.clone().requires_grad_(True)
        (module(xi) * weights).sum().backward()
        grads.append([xi.grad] + [p.grad for p in module.parameters()])
    for hf, ours in zip(*grads):
        torch.testing.assert_close(ours, hf, rtol=1e-12, atol=1e-12)


def test_the_mlp_keeps_two_intermediate_activations_instead_of_four(tiny_model_dir):
    layer = _layer(tiny_model_dir)
    lean = copy.deepcopy(layer)
    apply_lean_layers(lean)
    x = torch.randn(4, 9, layer.mlp.gate_proj.in_features, requires_grad=True)
    row = 4 * 9 * layer.mlp.gate_proj.out_features * 4  # one [tokens, intermediate] float32 tensor
    weights = {p.untyped_storage().data_ptr() for m in (layer, lean) for p in m.parameters()}

    def intermediates(mlp):
        return sum(1 for ptr, size in _saved_storages(mlp, x).items() if ptr not in weights and size == row)

    # HF: gate (SiLU's input), SiLU's output, up, the product (down_proj's input); lean: gate and up
    assert (intermediates(layer.mlp), intermediates(lean.mlp)) == (4, 2)
    with torch.no_grad():
        assert not _saved_storages(lean.mlp, x) and not _saved_storages(lean.input_layernorm, x)


def test_the_norm_keeps_its_input_and_one_statistic_per_token(tiny_model_dir):
    layer = _layer(tiny_model_dir, "bfloat16")
    lean = copy.deepcopy(layer)
    apply_lean_layers(lean)
    x = torch.randn(4, 9, layer.mlp.gate_proj.in_features, dtype=torch.bfloat16, requires_grad=True)
    weights = {p.untyped_storage().data_ptr() for m in (layer, lean) for p in m.parameters()}

    def activation_bytes(norm):
        return sum(size for ptr, size in _saved_storages(norm, x).items() if ptr not in weights)

    tokens, hidden = 4 * 9, x.shape[-1]
    # HF: the float32 input and the bf16 normalised value (+ rstd); lean: the bf16 input + float32 rstd
    assert activation_bytes(layer.input_layernorm) == tokens * hidden * (4 + 2) + tokens * 4
    assert activation_bytes(lean.input_layernorm) == tokens * hidden * 2 + tokens * 4


def test_a_lora_mlp_takes_the_swiglu_path_with_autograds_gradients(tiny_model_dir):
    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(tiny_model_dir), ModelConfig(path=tiny_model_dir, lora_rank=4)).double()
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter is zero: give it a gradient path through lora_A too
            p.data.normal_(0, 0.1)
    lean = copy.deepcopy(model)
    assert apply_lean_layers(lean)["mlp"] == len(decoder_layers(model))
    ids = torch.randint(0, 200, (2, 6))
    for m in (model, lean):
        m(input_ids=ids).logits.log_softmax(-1)[..., 3].sum().backward()
    trained = [(p, q) for p, q in zip(model.parameters(), lean.parameters()) if p.requires_grad]
    assert trained and all(q.grad is not None for _, q in trained)
    for p, q in trained:
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12)


def test_look_alike_modules_that_compute_more_keep_their_own_forward():
    olmo3 = pytest.importorskip("transformers.models.olmo3.modeling_olmo3")
    falcon = pytest.importorskip("transformers.models.falcon_h1.modeling_falcon_h1")
    norm = olmo3.Olmo3RMSNorm(16)  # multiplies by the weight in float32, then rounds: differs in bf16
    norm.weight.data.normal_()
    mlp = falcon.FalconH1MLP(falcon.FalconH1Config(hidden_size=16, intermediate_size=32, mlp_multipliers=[0.5, 2.0]))
    for module in (norm, mlp):
        before = module.forward
        assert apply_lean_layers(module) == {"rms_norm": 0, "mlp": 0, "skipped": 1}
        assert module.forward == before


def test_a_down_projection_with_bias_gets_its_gradient(tiny_model_dir):
    torch.manual_seed(0)
    mlp = _layer(tiny_model_dir).mlp.double()
    mlp.down_proj = nn.Linear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=True).double()
    lean = copy.deepcopy(mlp)
    assert apply_lean_layers(lean)["mlp"] == 1
    x = torch.randn(2, 5, mlp.gate_proj.in_features, dtype=torch.float64)
    for module in (mlp, lean):
        module(x).pow(2).sum().backward()
    for p, q in zip(mlp.parameters(), lean.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-12)


def test_the_builders_apply_it_to_trained_models_only(tiny_model_dir):
    def lean_mlps(model):
        return sum(getattr(m.forward, "__func__", None).__name__ == "lean_mlp" for m in model.modules()
                   if getattr(m.forward, "__func__", None) is not None)

    cfg, fsdp, cpu = ModelConfig(path=tiny_model_dir), FSDPConfig(), torch.device("cpu")
    layers = len(decoder_layers(load_causal_lm(tiny_model_dir)))
    assert lean_mlps(build_causal_lm(cfg, tiny_model_dir, fsdp, cpu, trainable=True)) == layers
    assert lean_mlps(build_causal_lm(cfg, tiny_model_dir, fsdp, cpu, trainable=False)) == 0  # the reference
    assert lean_mlps(build_value_model(cfg, tiny_model_dir, fsdp, cpu)) == layers
    off = ModelConfig(path=tiny_model_dir, use_lean_layers=False)
    assert lean_mlps(build_causal_lm(off, tiny_model_dir, fsdp, cpu, trainable=True)) == 0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_update_is_the_plain_models_update(tiny_model_dir, checkpointing):
    plain = load_causal_lm(tiny_model_dir).double()  # float64: the same math, without float32 rounding
    lean = copy.deepcopy(plain)
    apply_lean_layers(lean)
    if checkpointing:
        lean.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    data = ppo_batch(plain)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    actors = [DataParallelPPOActor(actor_config(ppo_micro_batch_size_per_gpu=4), m,
                                   torch.optim.SGD(m.parameters(), lr=1.0), use_remove_padding=True)
              for m in (plain, lean)]  # SGD: the step is the gradient (Adam would magnify ~1e-9 ones)
    (lp_p, _), (lp_l, _) = (a.compute_log_prob(data) for a in actors)
    assert torch.equal(lp_l, lp_p)
    metrics = [a.update_policy(data) for a in actors]
    assert metrics[1]["actor/grad_norm"][0] == pytest.approx(metrics[0]["actor/grad_norm"][0], rel=1e-10)
    for p_p, p_l in zip(plain.parameters(), lean.parameters()):
        torch.testing.assert_close(p_l, p_p, atol=1e-12, rtol=1e-10)


def _lora_layer(tiny_model_dir: str, dtype: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(path=tiny_model_dir, lora_rank=4, target_modules=["down_proj"])
    model = apply_lora(load_causal_lm(tiny_model_dir), cfg).to(getattr(torch, dtype))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter is zero: make its term show
            p.data.normal_(0, 0.1)
    return decoder_layers(model)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_lora_down_projection_is_fused_bit_identically_and_keeps_no_product(tiny_model_dir, dtype):
    from hybrid_rl.workers.lean_layers import _plain_lora

    layer = _lora_layer(tiny_model_dir, dtype)
    lean = copy.deepcopy(layer)
    apply_lean_layers(lean)
    assert _plain_lora(lean.mlp.down_proj) is not None
    x = torch.randn(3, 7, layer.mlp.gate_proj.in_features, dtype=getattr(torch, dtype), requires_grad=True)
    assert torch.equal(lean.mlp(x), layer.mlp(x))  # with grad: the fused autograd function
    row = 3 * 7 * layer.mlp.gate_proj.out_features * x.element_size()
    weights = {p.untyped_storage().data_ptr() for m in (layer, lean) for p in m.parameters()}

    def intermediates(mlp):
        return sum(1 for ptr, size in _saved_storages(mlp, x).items() if ptr not in weights and size == row)

    # HF + peft: gate, SiLU's output, up and the product (kept by lora_A); fused: gate and up
    assert (intermediates(layer.mlp), intermediates(lean.mlp)) == (4, 2)


@pytest.mark.parametrize("change", ["dropout", "merged", "disabled", "hook"])
def test_a_lora_layer_that_computes_more_keeps_peft_s_forward(tiny_model_dir, change):
    from hybrid_rl.workers.lean_layers import _plain_lora

    layer = _lora_layer(tiny_model_dir, "float32")
    down = layer.mlp.down_proj
    if change == "dropout":
        down.lora_dropout["default"] = nn.Dropout(0.1)
    elif change == "merged":
        down.merge()
    elif change == "disabled":
        down.enable_adapters(False)
    elif change == "hook":
        down.lora_A["default"].register_forward_hook(lambda *a: None)
    assert _plain_lora(down) is None
    lean = copy.deepcopy(layer)
    apply_lean_layers(lean)
    x = torch.randn(2, 3, layer.mlp.gate_proj.in_features)
    if change != "dropout":  # dropout draws differ between the two calls
        assert torch.equal(lean.mlp(x), layer.mlp(x))
