"""Streaming rows of the built-in tool loop (``multi_turn.enable``) with partial rollout, both engines.

As in test_multi_turn_engines.py, every token id is an EOS (each model turn is one sampled token) and a
registered interaction answers until the third assistant turn, so a trajectory's layout is known. Checks:
a streamed greedy row equals the batch path's row (ids, masks, log-probs, turns, turn scores, end reason)
for rows with and without an interaction; a row whose interaction is stuck holds no other row.
"""

import asyncio
import threading

import pytest
import torch

from hybrid_rl.agents import BaseInteraction, register_interaction
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.streaming import StreamRequest

_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
R = 64
ALL_IDS_EOS = tuple(range(320))  # the tiny model's vocabulary: every turn ends after one token
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [40, 41]]
GATE = threading.Event()


@register_interaction("test_stream_go_on")
class GoOn(BaseInteraction):
    """Answers "go on" until the third assistant turn; with ``gated`` it first waits for :data:`GATE`."""

    async def generate_response(self, instance_id, messages, **kwargs):
        while kwargs.get("gated") and not GATE.is_set():
            await asyncio.sleep(0.001)
        turns = sum(m["role"] == "assistant" for m in messages)
        return turns >= 3, "go on", float(turns), {}


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny_model_dir, tmp_path_factory):
    from hybrid_rl.workers.model_loader import load_tokenizer

    path = tmp_path_factory.mktemp("agents") / "interactions.yaml"
    path.write_text("interaction:\n  - name: go\n    class_name: test_stream_go_on\n")
    cfg = RolloutConfig(name=request.param, dtype="float32", response_length=R, prompt_length=40,
                        calculate_log_probs=True, max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0,
                        stream_segment_tokens=2, multi_turn={"enable": True, "interaction_config_path": str(path)})
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    yield rollout
    rollout.shutdown()


def _extra(talks: bool, gated: bool = False) -> dict:
    return {"interaction_kwargs": {"name": "go", "gated": gated}} if talks else {}


def _request(rid: str, prompt: list[int], talks: bool, gated: bool = False) -> StreamRequest:
    row = {"extra_info": _extra(talks, gated), "raw_prompt": [{"role": "user", "content": "q"}]}
    return StreamRequest(rid, list(prompt), R, {"row": row})


def _params() -> GenerationParams:
    return GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=None,
                            eos_token_ids=ALL_IDS_EOS, pad_token_id=0, response_length=R)


def _until(engine, done, steps=4000) -> dict:
    """Step until ``done(samples)`` (kept here, not imported: importing a test module under a second name
    would register its test loop twice, with a second copy of its gates)."""
    samples = {}
    for _ in range(steps):
        samples.update({s.request_id: s for s in engine.stream_step(0.01)})
        if done(samples):
            return samples
    raise AssertionError(f"never done; {engine.stream_pending()} rows pending, returned {sorted(samples)}")


def test_a_streamed_greedy_builtin_row_equals_the_batch_path(engine):
    talks = [True, True, False]
    engine.stream_submit([_request(f"r{i}", p, t) for i, (p, t) in enumerate(zip(PROMPTS, talks))], _params())
    samples = _until(engine, lambda _: engine.stream_pending() == 0)
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    batch = engine.generate_sequences(DataProto.from_dict(
        {"input_ids": ids, "attention_mask": att, "position_ids": (att.cumsum(1) - 1).clamp(min=0)},
        non_tensors={"extra_info": [_extra(t) for t in talks], "raw_prompt": [[{"role": "user", "content": "q"}]] * 3},
        meta_info={"eos_token_id": list(ALL_IDS_EOS), "pad_token_id": 0, "do_sample": False, "global_steps": 1}))
    version = engine.stream_state()["version"]
    for i, p in enumerate(PROMPTS):
        sample, n = samples[f"r{i}"], len(samples[f"r{i}"].response_ids)
        info = sample.meta["trajectory"]
        assert sample.prompt_ids == p and sample.response_ids == batch.batch["responses"][i, :n].tolist()
        assert info["response_mask"] == batch.batch["response_mask"][i, :n].tolist()
        assert batch.batch["response_mask"][i, n:].sum() == 0 and sum(info["response_mask"]) == (3 if talks[i] else 1)
        torch.testing.assert_close(torch.tensor(sample.log_probs), batch.batch["rollout_log_probs"][i, :n],
                                   atol=1e-4, rtol=0)
        assert sample.versions == [version if m else -1 for m in info["response_mask"]]
        assert info["num_turns"] == batch.non_tensor_batch["num_turns"][i] == (6 if talks[i] else 2)
        assert info["turn_scores"] == list(batch.non_tensor_batch["turn_scores"][i])
        assert info["agent_metrics"] == batch.non_tensor_batch["agent_metrics"][i]
        assert sample.finish_reason == ("interaction" if talks[i] else "stop")


def test_a_stuck_interaction_holds_no_other_row(engine):
    GATE.clear()
    try:
        engine.stream_submit([_request("stuck", PROMPTS[0], True, gated=True), _request("free", PROMPTS[1], True)],
                             _params())
        first = _until(engine, lambda s: "free" in s)
        assert "stuck" not in first and engine.stream_pending() == 1
        assert sum(first["free"].meta["trajectory"]["response_mask"]) == 3
        GATE.set()
        rest = _until(engine, lambda _: engine.stream_pending() == 0)
    finally:
        GATE.set()
    assert rest["stuck"].finish_reason == "interaction"
    assert sum(rest["stuck"].meta["trajectory"]["response_mask"]) == 3
