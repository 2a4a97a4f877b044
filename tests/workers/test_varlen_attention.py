"""Varlen attention on packed rows: same outputs as the padded batch, and no [T, T] mask used."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.workers import varlen_attention
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, make_batch


def test_cu_seq_lens():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    assert varlen_attention.cu_seq_lens(mask).tolist() == [0, 2, 5, 6]


@pytest.mark.parametrize("attention_path", ["batched", "per_block"])
def test_packed_log_probs_use_varlen_and_match_padded(tiny_model_dir, monkeypatch, attention_path):
    if attention_path == "per_block":
        monkeypatch.setattr(varlen_attention, "DENSE_MAX_SCORES", 0)
    model = load_causal_lm(tiny_model_dir)
    padded_actor = DataParallelPPOActor(actor_config(), copy.deepcopy(model))
    packed_actor = DataParallelPPOActor(actor_config(), model, use_remove_padding=True)
    assert model.config._attn_implementation == varlen_attention.VARLEN_ATTENTION
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[2], attn_mask is None, kw.get("is_causal")))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(varlen_attention.F, "scaled_dot_product_attention", spy)
    data = make_batch()
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    packed, ent_packed = packed_actor.compute_log_prob(data, calculate_entropy=True)
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    num_layers = model.config.num_hidden_layers
    # one maskless causal call per row and layer, each as long as that row (batched: none)
    assert sorted(c[0] for c in calls) == (sorted(lengths * num_layers) if attention_path == "per_block" else [])
    assert all(no_mask and causal for _, no_mask, causal in calls)
    padded, ent_padded = padded_actor.compute_log_prob(data, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(packed[mask], padded[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_packed[mask], ent_padded[mask], atol=1e-5, rtol=0)


def test_non_sdpa_models_are_left_alone(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    model.set_attn_implementation("eager")
    assert not varlen_attention.use_varlen_attention(model)
    assert model.config._attn_implementation == "eager"


def test_a_model_outside_the_attention_interface_is_not_claimed():
    """Falcon computes attention in its own code: transformers refuses the switch (with a console
    warning), so the packed layout would be ignored; the actor must not believe it was switched."""
    from transformers import AutoModelForCausalLM, FalconConfig

    model = AutoModelForCausalLM.from_config(FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=4), attn_implementation="sdpa")
    assert not varlen_attention.use_varlen_attention(model)
    assert model.config._attn_implementation == "sdpa"


def _blocks_and_inputs(dtype):
    """Three blocks tiling T = 12: causal (4), masked like a prompt group (6), causal (2)."""
    from hybrid_rl.workers.packing import group_mask

    blocks = [varlen_attention.PackedBlock(0, 4), varlen_attention.PackedBlock(4, 10, group_mask(2, [3, 1])),
              varlen_attention.PackedBlock(10, 12)]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 12, 8, generator=g, dtype=dtype)  # 6 query heads share 2 kv heads
    k, v = (torch.randn(1, 2, 12, 8, generator=g, dtype=dtype) for _ in range(2))
    return blocks, q, k, v


def _attention_and_grads(fn, q, k, v):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_batched_blocks_equal_one_sdpa_call_per_block(dtype, tol):
    blocks, q, k, v = _blocks_and_inputs(dtype)
    layout = varlen_attention.PackedLayout(blocks)
    dense = layout.dense(heads=6, device=q.device, dtype=dtype)
    assert dense.shape == (3, 6)

    def per_block(q, k, v):
        return varlen_attention._blocks_attention(q, k, v, blocks, 0.0, 8**-0.5).transpose(1, 2)

    expected = _attention_and_grads(per_block, q, k, v)
    got = _attention_and_grads(lambda q, k, v: varlen_attention._dense_attention(q, k, v, dense, 8**-0.5), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol, msg=name)
    # block 0 alone by hand: causal softmax attention, query head 5 reads kv head 1
    scores = (q[0, 5, :4].double() @ k[0, 1, :4].double().T) * 8**-0.5
    probs = scores.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(got[0][0, :4, 5].double(), probs @ v[0, 1, :4].double(), atol=tol, rtol=tol)


def test_the_batched_form_keeps_no_probabilities_for_backward():
    blocks, q, k, v = _blocks_and_inputs(torch.float32)
    dense = varlen_attention.PackedLayout(blocks).dense(heads=6, device=q.device, dtype=torch.float32)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        varlen_attention._dense_attention(q, k, v, dense, 8**-0.5)
    width = dense.shape[1]
    # q, k, v (gathered into blocks) and the layout's mask; nothing [..., L_max, L_max] (probabilities)
    squares = [t.shape for t in saved if t.dim() >= 3 and t.shape[-1] == width and t.shape[-2] % width == 0
               and t.untyped_storage().data_ptr() != dense.bias.untyped_storage().data_ptr()]
    assert saved and not squares


def test_layouts_too_large_for_the_batched_form_fall_back(monkeypatch):
    blocks, *_ = _blocks_and_inputs(torch.float32)
    layout = varlen_attention.PackedLayout(blocks)
    monkeypatch.setattr(varlen_attention, "DENSE_MAX_SCORES", 3 * 6 * 6**2 - 1)  # blocks x heads x 6**2
    assert layout.dense(heads=6, device=torch.device("cpu"), dtype=torch.float32) is None
    monkeypatch.setattr(varlen_attention, "DENSE_MAX_SCORES", 3 * 6 * 6**2)
    assert layout.dense(heads=6, device=torch.device("cpu"), dtype=torch.float32) is not None
