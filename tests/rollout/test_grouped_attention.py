"""The grouped decode attention equals transformers' ``sdpa`` attention (which repeats the KV heads)."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hybrid_rl.utils.testing import tiny_llama_config
from hybrid_rl.workers.rollout import grouped_attention as ga

B, H, H_KV, L, D = 3, 6, 2, 7, 8


def _inputs(q_len=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, q_len, D, generator=g)
    key, value = torch.randn(2, B, H_KV, L, D, generator=g)
    valid = torch.rand(B, 1, q_len, L, generator=g) > 0.3
    valid[..., -1] = True  # every row attends to something
    return query, key, value, valid


MODULE = SimpleNamespace(num_key_value_groups=H // H_KV, is_causal=True)


@pytest.mark.parametrize("additive", [False, True])
def test_decode_step_equals_sdpa_with_repeated_kv(additive):
    query, key, value, mask = _inputs()
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert ga.foldable(MODULE, query, mask, {})
    out, _ = ga.grouped_decode_attention_forward(MODULE, query, key, value, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(MODULE, query, key, value, mask, scaling=0.3)
    assert out.shape == ref.shape == (B, 1, H, D)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_query_head_h_reads_kv_head_h_over_groups():
    """Hand-checkable: one valid position per row, so each head's output is that position's value
    row of its own KV head (heads 0-2 -> KV head 0, heads 3-5 -> KV head 1)."""
    query, key, value, _ = _inputs()
    mask = torch.zeros(B, 1, 1, L, dtype=torch.bool)
    mask[:, :, :, 4] = True
    out, _ = ga.grouped_decode_attention_forward(MODULE, query, key, value, mask)
    for h in range(H):
        torch.testing.assert_close(out[:, 0, h], value[:, h // (H // H_KV), 4])


@pytest.mark.parametrize("case", ["prefill", "no_mask", "no_groups"])
def test_other_calls_are_transformers_sdpa(case):
    query, key, value, mask = _inputs(q_len=3 if case == "prefill" else 1)
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True) if case == "no_groups" else MODULE
    if case == "no_groups":
        key, value = key.repeat_interleave(H // H_KV, 1), value.repeat_interleave(H // H_KV, 1)
    mask = None if case == "no_mask" else mask
    assert not ga.foldable(module, query, mask, {})
    out, _ = ga.grouped_decode_attention_forward(module, query, key, value, mask)
    assert torch.equal(out, sdpa_attention_forward(module, query, key, value, mask)[0])


def test_position_bias_and_attention_outputs_are_not_folded():
    query, _, _, mask = _inputs()
    assert not ga.foldable(MODULE, query, mask, {"position_bias": torch.zeros(1)})
    assert not ga.foldable(MODULE, query, mask, {"output_attentions": True})


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_is_unchanged_and_decode_steps_fold(cache, monkeypatch):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(num_attention_heads=4, num_key_value_heads=2, head_dim=32), dtype=torch.float32)
    ids = torch.randint(3, 300, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = mask[3, :2] = 0  # left padding: transformers' sdpa repeats the KV heads here
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    if cache == "static":
        kwargs.update(cache_implementation="static", disable_compile=True)
    expected = model.generate(ids, **kwargs)
    folded = []
    real = ga.foldable
    monkeypatch.setattr(ga, "foldable", lambda *a: folded.append(real(*a)) or folded[-1])
    assert ga.use_grouped_decode_attention(model)
    assert model.config._attn_implementation == ga.GROUPED_DECODE_ATTENTION
    assert torch.equal(model.generate(ids, **kwargs), expected)
    assert sum(folded) == 5 * model.config.num_hidden_layers  # every decode step after the prefill


def test_other_attention_implementations_are_kept():
    model = AutoModelForCausalLM.from_config(tiny_llama_config(), dtype=torch.float32, attn_implementation="eager")
    assert not ga.use_grouped_decode_attention(model)
    assert model.config._attn_implementation == "eager"


def test_a_model_outside_the_attention_interface_is_left_alone_without_a_warning():
    from transformers import FalconConfig

    from hybrid_rl.utils.testing import library_warnings

    model = AutoModelForCausalLM.from_config(FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=4), attn_implementation="sdpa")
    with library_warnings() as warnings:
        assert not ga.use_grouped_decode_attention(model)
    assert model.config._attn_implementation == "sdpa" and warnings == []


def test_hf_rollout_decodes_with_the_grouped_attention(tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer
    from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

    cfg = RolloutConfig(name="hf", dtype="float32", response_length=4, prompt_length=16)
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    assert rollout.model.config._attn_implementation == ga.GROUPED_DECODE_ATTENTION


def test_compiled_static_cache_decode_traces_it_in_one_graph(monkeypatch):
    """On CUDA transformers compiles the static-cache decode step with ``fullgraph=True``; the grouped
    attention must trace without a graph break (``aot_eager`` here: the same tracing, no kernels)."""
    from transformers import CompileConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_llama_config(num_attention_heads=4, num_key_value_heads=2, head_dim=32), dtype=torch.float32)
    ids = torch.randint(3, 300, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
                  cache_implementation="static")
    expected = model.generate(ids, disable_compile=True, **kwargs)
    compile_config = CompileConfig(backend="aot_eager", fullgraph=True)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only by default
    folded = []
    real = ga.foldable
    monkeypatch.setattr(ga, "foldable", lambda *a: folded.append(real(*a)) or folded[-1])
    ga.use_grouped_decode_attention(model)
    assert torch.equal(model.generate(ids, compile_config=compile_config, **kwargs), expected)
    assert hasattr(model, "_compiled_call")  # the decode steps ran compiled
    assert any(folded)  # and the traced graph is the folded one


def test_a_value_head_size_other_than_the_query_s():
    query, key, _, mask = _inputs()
    value = torch.randn(B, H_KV, L, D // 2)
    out, _ = ga.grouped_decode_attention_forward(MODULE, query, key, value, mask)
    ref, _ = sdpa_attention_forward(MODULE, query, key, value, mask)
    assert out.shape == ref.shape == (B, 1, H, D // 2)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
