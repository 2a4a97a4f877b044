"""Streaming generation with partial rollout on both engines (tiny fp32 model; one engine per param).

The acceptance test forces a weight update mid-generation and checks every returned token: its
version tag is the version of the weights that sampled it (0 up to where the request stood at the
switch, 1 after), and its log-prob is that token's log-prob under those weights, recomputed by a
plain HF forward of prompt + preceding tokens. vLLM cases are skipped where vLLM is not importable.
"""

import os
import pickle

import pytest
import torch

from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.streaming import StreamRequest

R = 12  # response_length
SEGMENT = 4  # hf tokens per segment
EOS = 2
_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [40, 41], [70, 71, 72, 73, 74]]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=request.param, dtype="float32", response_length=R, prompt_length=40,
                        calculate_log_probs=True, max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0,
                        stream_segment_tokens=SEGMENT)
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    assert rollout.name == request.param
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def state_dict(tiny_model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(tiny_model_dir, "model.safetensors"))


def _params(do_sample: bool) -> GenerationParams:
    return GenerationParams(do_sample=do_sample, temperature=1.0 if do_sample else 0.0, top_p=1.0, top_k=-1,
                            seed=None, eos_token_ids=(EOS,), pad_token_id=0, response_length=R)


def _requests(max_tokens=(R, R - 3, R, 7)) -> list[StreamRequest]:
    return [StreamRequest(f"r{i}", list(p), m, {"row": i}) for i, (p, m) in enumerate(zip(PROMPTS, max_tokens))]


def _drain(engine, budget_s=0.0) -> dict:
    samples = {}
    for _ in range(10 * R):  # a request the engine lost would otherwise spin here forever
        if not engine.stream_pending():
            return samples
        for sample in engine.stream_step(budget_s):
            assert sample.request_id not in samples
            samples[sample.request_id] = sample
    raise AssertionError(f"{engine.stream_pending()} requests never finished")


def _token_log_probs(model_dir, weights, prompt, response) -> list[float]:
    """log p(response[i] | prompt + response[:i]) under ``weights`` by one plain HF forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(weights)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1]  # [len(response), V]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def test_streamed_greedy_samples_equal_the_batch_path(engine):
    version = engine.stream_state()["version"]
    requests = _requests()
    engine.stream_submit(requests, _params(do_sample=False))
    assert engine.stream_pending() == len(requests)
    samples = _drain(engine)
    assert pickle.loads(pickle.dumps(samples)) == samples  # plain data
    turns = engine.generate_turn([r.prompt_ids for r in requests], [r.max_tokens for r in requests],
                                 _params(do_sample=False))
    for req, (tokens, log_probs) in zip(requests, turns):
        sample = samples[req.request_id]
        assert sample.response_ids == tokens and sample.meta == req.meta and sample.prompt_ids == req.prompt_ids
        torch.testing.assert_close(torch.tensor(sample.log_probs), torch.tensor(log_probs), atol=1e-4, rtol=0)
        assert sample.versions == [version] * len(tokens) and sample.staleness(version + 2) == 2
        assert sample.finish_reason == ("stop" if tokens[-1] == EOS else "length")
        assert len(tokens) == req.max_tokens or tokens[-1] == EOS


def _step_partway(engine, steps: int) -> dict[str, int]:
    """Advance a few steps without finishing everything; return each request's length then."""
    finished = {}
    for _ in range(steps):
        finished.update({s.request_id: s for s in engine.stream_step(0.0)})
    assert engine.stream_pending() > 0, "every request finished before the weight switch"
    lengths = {item["request"]["request_id"]: len(item["response_ids"]) for item in engine.stream_state()["requests"]}
    return finished, lengths


def test_weight_update_mid_generation_tags_versions_and_log_probs(engine, state_dict, tiny_model_dir):
    """Each token carries the version that sampled it and its log-prob under those weights."""
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in state_dict.items()}
    v0 = engine.stream_state()["version"]
    engine.stream_submit(_requests(), _params(do_sample=True))
    try:
        early, at_switch = _step_partway(engine, 1 if engine.name == "hf" else 5)
        engine.stream_update_weights(iter(perturbed.items()), v0 + 1)
        samples = {**early, **_drain(engine)}
    finally:
        engine.stream_update_weights(iter(state_dict.items()), v0 + 2)
    weights = {v0: state_dict, v0 + 1: perturbed}
    switched = 0
    for req in _requests():
        sample = samples[req.request_id]
        k = at_switch.get(req.request_id, len(sample.response_ids))  # finished early: all version 0
        assert sample.versions == [v0] * k + [v0 + 1] * (len(sample.response_ids) - k)
        switched += 0 < k < len(sample.response_ids)
        for version in set(sample.versions):
            idx = [i for i, v in enumerate(sample.versions) if v == version]
            expected = _token_log_probs(tiny_model_dir, weights[version], sample.prompt_ids, sample.response_ids)
            torch.testing.assert_close(torch.tensor([sample.log_probs[i] for i in idx]),
                                       torch.tensor([expected[i] for i in idx]), atol=1e-4, rtol=0)
    assert switched >= 2  # requests really continued across the switch


def test_state_restore_continues_a_request_exactly(engine):
    v0 = engine.stream_state()["version"]
    engine.stream_submit(_requests(), _params(do_sample=False))
    early, _ = _step_partway(engine, 1 if engine.name == "hf" else 4)
    state = pickle.loads(pickle.dumps(engine.stream_state()))
    continued = {**early, **_drain(engine)}
    engine.stream_restore(state)
    assert engine.stream_pending() == len(state["requests"]) and engine.stream_state()["version"] == v0
    restored = {**early, **_drain(engine)}
    assert sorted(restored) == sorted(continued) == sorted(r.request_id for r in _requests())
    for rid, sample in continued.items():
        assert restored[rid].response_ids == sample.response_ids and restored[rid].versions == sample.versions
        torch.testing.assert_close(torch.tensor(restored[rid].log_probs), torch.tensor(sample.log_probs),
                                   atol=1e-4, rtol=0)


def test_a_batch_call_or_sleep_while_streaming_leaves_both_intact(engine):
    engine.stream_submit(_requests(), _params(do_sample=False))
    early, _ = _step_partway(engine, 1 if engine.name == "hf" else 4)
    prompts = [[5, 6, 7], [9, 10]]
    batch = engine.generate_turn(prompts, [R, R], _params(do_sample=False))
    early.update({s.request_id: s for s in engine.stream_step(0.0)})
    engine.sleep()  # vLLM on CPU frees the KV cache: the requests re-prefill after the wake
    engine.wake_up()
    samples = {**early, **_drain(engine)}
    assert batch == engine.generate_turn(prompts, [R, R], _params(do_sample=False))
    reference = engine.generate_turn(PROMPTS, [r.max_tokens for r in _requests()], _params(do_sample=False))
    assert [samples[r.request_id].response_ids for r in _requests()] == [t for t, _ in reference]


def test_stream_rejects_bad_input_in_one_line(engine, monkeypatch):
    import dataclasses

    params = _params(do_sample=False)
    cases = [
        ([StreamRequest("a", [], 4)], "request 'a' has a 0-token prompt; it must have 1..rollout.prompt_length=40"),
        ([StreamRequest("a", [5] * 41, 4)], "request 'a' has a 41-token prompt"),
        ([StreamRequest("a", [5], 0)], r"request 'a' asks max_tokens=0; it must be in 1..rollout.response_length=12"),
        ([StreamRequest("a", [5], R + 1)], "asks max_tokens=13"),
        ([StreamRequest("a", [5], 4), StreamRequest("a", [6], 4)], "request_id 'a' is already in flight or repeated"),
    ]
    for requests, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.stream_submit(requests, params)
        assert engine.stream_pending() == 0
    with pytest.raises(TypeError, match="got a dict, not a StreamRequest"):
        engine.stream_submit([{"request_id": "a"}], params)
    with pytest.raises(ValueError, match="stream_step: max_wall_s=-1 is invalid"):
        engine.stream_step(-1)
    with pytest.raises(ValueError, match=r"stream_set_version: version=-1 is invalid: versions are integers"):
        engine.stream_set_version(-1)
    engine.stream_submit([StreamRequest("a", [5], 4)], params)
    with pytest.raises(ValueError, match="stream_restore: 1 requests are in flight"):
        engine.stream_restore({"version": 0, "requests": []})
    _drain(engine)
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, calculate_log_probs=False))
    with pytest.raises(ValueError, match="rollout.calculate_log_probs is false"):
        engine.stream_submit([StreamRequest("b", [5], 4)], params)
    monkeypatch.setattr(engine, "multi_turn", object())
    with pytest.raises(ValueError, match="streaming serves single-turn rows only"):
        engine.stream_submit([StreamRequest("b", [5], 4)], params)
