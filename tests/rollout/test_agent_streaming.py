"""Streaming agent rows with partial rollout (agent_stream.py) on the tiny fp32 model.

A registered test loop plays an environment: row i takes ``test_moves`` model turns of at most TURN
tokens, each followed by an environment step (a short sleep, or a wait on a gate the test opens) and,
but for the last, an observation of two tokens (mask 0). Checks: a short episode comes back while a
long one is stuck in its environment (ordering by events, not timing), a row submitted later joins and
finishes first; a streamed greedy trajectory equals the batch path's; a weight update forced mid-turn
tags every model token with the version that sampled it and its log-prob equals a plain HF forward under
those weights; observations carry version -1.
"""

import asyncio
import os
import pickle
import threading

import pytest
import torch

from hybrid_rl.agents import AgentLoopBase, AgentLoopOutput, register_agent_loop
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.rollout.agent_stream import token_versions
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.streaming import StreamRequest

R = 24  # response_length
TURN = 4  # most tokens of one model turn
EOS = 2
OBS = [50, 51]
GATES: dict[str, threading.Event] = {}
_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [40, 41]]


@register_agent_loop("test_stream_moves")
class Moves(AgentLoopBase):
    """``test_moves`` turns, each followed by an environment step; observations between turns."""

    async def run(self, sampling_params, **kwargs):
        prompt, moves = list(kwargs["test_prompt_ids"]), int(kwargs["test_moves"])
        if moves < 0:
            raise RuntimeError("the environment crashed")
        gate = GATES.get(kwargs.get("test_gate"))
        ids, mask, log_probs = [], [], []
        for move in range(moves):
            out = await self.server_manager.generate(
                "env", prompt_ids=prompt + ids, sampling_params={**sampling_params, "max_tokens": TURN})
            ids, mask, log_probs = ids + out.token_ids, mask + [1] * len(out.token_ids), log_probs + out.log_probs
            while gate is not None and not gate.is_set():  # the environment's slow step
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.002)
            if move < moves - 1:
                ids, mask, log_probs = ids + OBS, mask + [0, 0], log_probs + [0.0, 0.0]
        return AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=mask, response_logprobs=log_probs,
                               num_turns=2 * moves + 1, reward_score=float(moves),
                               extra_fields={"turn_scores": [1.0] * moves})


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=request.param, dtype="float32", response_length=R, prompt_length=16,
                        calculate_log_probs=True, max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0,
                        stream_segment_tokens=2, agent={"default_agent_loop": "test_stream_moves"})
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    yield rollout
    rollout.shutdown()


def _params(do_sample: bool) -> GenerationParams:
    return GenerationParams(do_sample=do_sample, temperature=1.0 if do_sample else 0.0, top_p=1.0, top_k=-1,
                            seed=None, eos_token_ids=(EOS,), pad_token_id=0, response_length=R)


def _request(rid: str, prompt: list[int], moves: int, gate: str = "") -> StreamRequest:
    row = {"test_prompt_ids": list(prompt), "test_moves": moves, "test_gate": gate}
    return StreamRequest(rid, list(prompt), R, {"row": row})


def _until(engine, done, steps=2000) -> dict:
    """Step until ``done(samples)``; a row the engine lost would otherwise spin here forever."""
    samples = {}
    for _ in range(steps):
        samples.update({s.request_id: s for s in engine.stream_step(0.01)})
        if done(samples):
            return samples
    raise AssertionError(f"never done; {engine.stream_pending()} rows pending, returned {sorted(samples)}")


def _drain(engine) -> dict:
    return _until(engine, lambda _: engine.stream_pending() == 0)


def test_a_short_episode_returns_while_a_long_one_waits_on_its_environment(engine):
    GATES["slow"] = threading.Event()
    try:
        engine.stream_submit([_request("long", PROMPTS[0], 3, gate="slow"), _request("short", PROMPTS[1], 1)],
                             _params(do_sample=False))
        first = _until(engine, lambda s: "short" in s)
        assert "long" not in first and engine.stream_pending() == 1  # stuck in its environment, not holding short
        engine.stream_submit([_request("late", PROMPTS[2], 2)], _params(do_sample=False))  # joins while long runs
        later = _until(engine, lambda s: "late" in s)
        assert "long" not in later and engine.stream_pending() == 1
        GATES["slow"].set()
        rest = _drain(engine)
    finally:
        GATES["slow"].set()
    long = rest["long"]
    model = [m for m in long.meta["trajectory"]["response_mask"] if m]
    assert long.meta["trajectory"]["num_turns"] == 3 + 2 + 1 and long.meta["trajectory"]["reward_score"] == 3.0
    assert 3 <= len(model) <= 3 * TURN and long.response_ids.count(OBS[0]) >= 2
    assert pickle.loads(pickle.dumps(long)) == long  # plain data


def test_a_streamed_greedy_trajectory_equals_the_batch_path(engine):
    moves = [1, 2, 3]
    engine.stream_submit([_request(f"r{i}", p, m) for i, (p, m) in enumerate(zip(PROMPTS, moves))],
                         _params(do_sample=False))
    samples = _drain(engine)
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    batch = engine.generate_sequences(DataProto.from_dict(
        {"input_ids": ids, "attention_mask": att, "position_ids": (att.cumsum(1) - 1).clamp(min=0)},
        non_tensors={"test_prompt_ids": [list(p) for p in PROMPTS], "test_moves": moves, "test_gate": [""] * 3},
        meta_info={"eos_token_id": [EOS], "pad_token_id": 0, "do_sample": False, "global_steps": 1}))
    version = engine.stream_state()["version"]
    for i, p in enumerate(PROMPTS):
        sample, n = samples[f"r{i}"], len(samples[f"r{i}"].response_ids)
        mask = sample.meta["trajectory"]["response_mask"]
        assert sample.prompt_ids == p and sample.response_ids == batch.batch["responses"][i, :n].tolist()
        assert mask == batch.batch["response_mask"][i, :n].tolist() and batch.batch["response_mask"][i, n:].sum() == 0
        torch.testing.assert_close(torch.tensor(sample.log_probs), batch.batch["rollout_log_probs"][i, :n],
                                   atol=1e-4, rtol=0)
        assert sample.versions == [version if m else -1 for m in mask]
        assert sample.meta["trajectory"]["turn_scores"] == [1.0] * moves[i]
        assert sample.meta["trajectory"]["num_turns"] == batch.non_tensor_batch["num_turns"][i]


def _token_log_probs(model_dir, weights, prompt, response) -> list[float]:
    """log p(response[i] | prompt + response[:i]) under ``weights`` by one plain HF forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(weights)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1]  # [len(response), V]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def _mid_turn(engine) -> bool:
    inner = engine._streamer.inner.in_flight.values()
    return any(0 < len(p.response_ids) < p.request.max_tokens and p.finish_reason() is None for p in inner)


def test_a_weight_update_mid_turn_tags_versions_and_log_probs(engine, tiny_model_dir):
    from safetensors.torch import load_file

    state_dict = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in state_dict.items()}
    v0 = engine.stream_state()["version"]
    engine.stream_submit([_request(f"w{i}", p, 3) for i, p in enumerate(PROMPTS)], _params(do_sample=True))
    try:
        early = {}
        for _ in range(2000):
            if _mid_turn(engine):
                break
            early.update({s.request_id: s for s in engine.stream_step(0.0)})
        assert _mid_turn(engine), "no model turn was caught mid-way"
        engine.stream_update_weights(iter(perturbed.items()), v0 + 1)
        samples = {**early, **_drain(engine)}
    finally:
        engine.stream_update_weights(iter(state_dict.items()), v0 + 2)
    weights, straddled = {v0: state_dict, v0 + 1: perturbed}, 0
    for i, p in enumerate(PROMPTS):
        sample = samples[f"w{i}"]
        mask = sample.meta["trajectory"]["response_mask"]
        assert [v == -1 for v in sample.versions] == [m == 0 for m in mask]  # observations: -1, model tokens: real
        model_versions = [v for v in sample.versions if v != -1]
        assert set(model_versions) <= {v0, v0 + 1} and model_versions == sorted(model_versions)  # never back
        for version in set(sample.versions) - {-1}:
            idx = [k for k, v in enumerate(sample.versions) if v == version]
            expected = _token_log_probs(tiny_model_dir, weights[version], sample.prompt_ids, sample.response_ids)
            torch.testing.assert_close(torch.tensor([sample.log_probs[k] for k in idx]),
                                       torch.tensor([expected[k] for k in idx]), atol=1e-4, rtol=0)
        straddled += any(sample.versions[k] == v0 and sample.versions[k + 1] == v0 + 1
                         for k in range(len(mask) - 1) if mask[k] and mask[k + 1])
    assert straddled >= 1  # a turn really continued across the switch


def test_token_versions_maps_served_versions_onto_model_tokens():
    assert token_versions([1, 1, 0, 0, 1], [3, 3, 4], fallback=9) == [3, 3, -1, -1, 4]
    # a loop that returned fewer model tokens than it was served: its oldest version everywhere
    assert token_versions([1, 0, 1], [3, 4, 4], fallback=9) == [3, -1, 3]
    assert token_versions([1, 0], [], fallback=9) == [9, -1]


def test_a_builtin_tool_loop_row_streams_beside_registered_loops(engine):
    """A row naming ``tool_agent`` (no tools, no interaction here) is one model turn of the built-in loop."""
    engine.stream_submit([StreamRequest("b", [5], 4, {"row": {"agent_name": "tool_agent"}})], _params(do_sample=False))
    sample = _drain(engine)["b"]
    info = sample.meta["trajectory"]
    assert 1 <= len(sample.response_ids) <= 4 and info["response_mask"] == [1] * len(sample.response_ids)
    assert info["num_turns"] == 2 and sample.finish_reason == ("stop" if sample.response_ids[-1] == EOS else "length")


def test_a_loop_that_raises_fails_its_row_only(engine):
    engine.stream_submit([_request("crash", PROMPTS[0], -1), _request("fine", PROMPTS[1], 1)], _params(do_sample=False))
    samples = _drain(engine)
    crash, fine = samples["crash"], samples["fine"]
    assert crash.finish_reason == "error" and crash.response_ids == [] and crash.versions == []
    assert crash.meta["trajectory"]["reward_score"] == 0.0 and crash.prompt_ids == PROMPTS[0]
    assert fine.finish_reason == "stop" and len(fine.response_ids) >= 1
