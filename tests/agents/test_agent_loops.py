"""Custom agent loops (veRL's AgentLoopBase shape): the batching server, the YAML with _target_ entries,
per-row agent_name, failures that score 0, and the layout of the rollout batch they produce."""

import asyncio
import dataclasses
import threading
import time

import pytest
import torch

from hybrid_rl.agents import AgentLoopBase, AgentLoopOutput
from hybrid_rl.agents.agent_loop import load_agent_loop_config
from hybrid_rl.agents.server import TURN_SEED_STRIDE, BatchingServer, LLMServerManager
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.base import GenerationParams
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from hybrid_rl.utils.testing import build_byte_tokenizer

EOS = 2
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=7, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=16)


class Recorder:
    """A turn_fn answering each request with [len(prompt), 100 + round, EOS] and recording its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, token_lists, max_tokens, params):
        self.calls.append(([list(t) for t in token_lists], list(max_tokens), params))
        out = [[len(t), 100 + len(self.calls) - 1, EOS][:m] for t, m in zip(token_lists, max_tokens)]
        return [(ids, [-0.5] * len(ids)) for ids in out]


def test_server_batches_rounds_seeds_them_and_honours_limits():
    engine = Recorder()
    server = BatchingServer(engine, PARAMS, max_model_len=20)

    def agent(prompt_len, calls):
        async def run():
            outs = []
            for _ in range(calls):
                outs.append(await server.generate(list(range(prompt_len)), {"max_tokens": 2 if prompt_len == 3 else None}))
            return outs
        return run

    results = server.run([agent(3, 2), agent(5, 2), agent(19, 1)], timeout_s=30)  # must finish: generous
    assert [status for status, _ in results] == ["ok"] * 3
    # two rounds: all three agents wait on round 0, the two with a second call on round 1
    assert [len(prompts) for prompts, _, _ in engine.calls] == [3, 2]
    assert [p.seed for _, _, p in engine.calls] == [7, 7 + TURN_SEED_STRIDE]
    assert engine.calls[0][1] == [2, 15, 1]  # asked max_tokens; the context room (20 - 5, 20 - 19)
    first = results[0][1][0]
    assert (first.token_ids, first.log_probs, first.stop_reason) == ([3, 100], [-0.5, -0.5], "length")
    assert results[1][1][1].token_ids == [5, 101, EOS] and results[1][1][1].stop_reason == "completed"


def test_rounds_follow_row_order_and_wait_for_every_agent_without_a_window():
    engine = Recorder()
    server = BatchingServer(engine, PARAMS, max_model_len=64)  # no window
    managers = [LLMServerManager(server, row=r) for r in range(3)]

    def agent(row, delay):
        async def run():
            await asyncio.sleep(delay)  # row 2 arrives first, row 0 last, 0.2 s later
            return (await managers[row].generate("r", prompt_ids=[row + 1])).token_ids
        return run

    results = server.run([agent(0, 0.2), agent(1, 0.1), agent(2, 0.0)], timeout_s=30)
    assert [v for _, v in results] == [[1, 100, EOS], [1, 100, EOS], [1, 100, EOS]]
    assert engine.calls[0][0] == [[1], [2], [3]] and len(engine.calls) == 1  # one round, in row order


def test_server_groups_sampling_settings_and_treats_temperature_zero_as_greedy():
    engine = Recorder()
    server = BatchingServer(engine, PARAMS, max_model_len=64)
    agents = [lambda t=t: server.generate([1, 2], {"temperature": t}) for t in (0.0, 1.0, 0.0)]
    assert all(status == "ok" for status, _ in server.run(agents, timeout_s=30))
    greedy = [p for _, _, p in engine.calls if not p.do_sample]
    assert len(engine.calls) == 2 and len(greedy) == 1 and greedy[0].temperature == 0.0
    assert sorted(len(prompts) for prompts, _, _ in engine.calls) == [1, 2]


def test_failing_hanging_and_blocking_agents_never_fail_the_batch():
    engine = Recorder()
    server = BatchingServer(engine, PARAMS, max_model_len=64, batch_window_s=0.05)
    released = threading.Event()

    async def raises():
        raise RuntimeError("boom")

    async def hangs():
        await asyncio.sleep(3600)

    async def blocks():
        released.wait(60)  # synchronous: blocks the event loop far past the timeout

    async def fine():
        return (await server.generate([1], None)).token_ids

    # one timeout for the run: long enough for `fine` on a slow, loaded machine (a round takes ~0.05 s)
    results = server.run([raises, hangs, fine], timeout_s=5)
    assert results[0] == ("error", "RuntimeError: boom") and results[1][0] == "timeout"
    assert results[2] == ("ok", [1, 100, EOS])
    started = time.monotonic()
    try:
        status = BatchingServer(engine, PARAMS, max_model_len=64).run([blocks], timeout_s=0.2)[0][0]
        waited = time.monotonic() - started
    finally:
        released.set()  # let the left-behind event loop go
    assert status == "timeout"
    assert waited < 30  # not held until the blocking call returns (60 s)


class TwoCalls(AgentLoopBase):
    """Asks the model, appends an observation of `note` (masked), asks again; scores itself when told."""

    def __init__(self, *args, note="ok", self_score=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.note, self.self_score = note, self_score

    async def run(self, sampling_params, **kwargs):
        assert sampling_params["temperature"] == 1.0 and sampling_params["logprobs"] is True
        assert self.config.actor_rollout_ref.rollout.response_length == 16
        prompt = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        first = await self.server_manager.generate("r", prompt_ids=prompt, sampling_params=sampling_params)
        note = self.tokenizer(self.note, add_special_tokens=False)["input_ids"]
        second = await self.server_manager.generate("r", prompt_ids=prompt + first.token_ids + note,
                                                    sampling_params=sampling_params)
        ids = first.token_ids + note + second.token_ids
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=ids, num_turns=4, reward_score=self.self_score,
            response_mask=[1] * len(first.token_ids) + [0] * len(note) + [1] * len(second.token_ids),
            response_logprobs=first.log_probs + [0.0] * len(note) + second.log_probs,
            extra_fields={"tool_rewards": [0.25]}, metrics={"generate_sequences": 0.1})


class Broken(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        if kwargs["extra_info"]["how"] == "raise":
            raise KeyError("no such key")
        return {"prompt_ids": [1], "response_ids": [5, 6], "response_mask": [1]}  # lengths differ


@pytest.fixture()
def generator(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text(f"""- name: two_calls
  _target_: {__name__}.TwoCalls
  note: "seen"
- name: two_calls_scored
  _target_: {__name__}.TwoCalls
  self_score: 0.75
- name: broken
  _target_: {__name__}.Broken
""")
    cfg = RolloutConfig(name="hf", response_length=16, prompt_length=64, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 5})
    tok = build_byte_tokenizer()
    return MultiTurnGenerator(cfg, tok, EOS), tok


def _batch(tok, agent_names, extra):
    messages = [{"role": "user", "content": "hi"}]
    prompt = tok("P", add_special_tokens=False)["input_ids"]
    n = len(agent_names)
    ids = torch.tensor([[0] * 40 + prompt] * n)
    mask = torch.tensor([[0] * 40 + [1] * len(prompt)] * n)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
                               non_tensors={"agent_name": agent_names, "extra_info": extra,
                                            "raw_prompt": [messages] * n}, meta_info={})


def test_yaml_loops_run_per_row_with_masks_scores_and_failures(generator):
    gen, tok = generator
    engine = Recorder()
    names = ["two_calls", "two_calls_scored", "broken", "broken"]
    extra = [{}, {}, {"how": "raise"}, {"how": "garbage"}]
    batch = _batch(tok, names, extra)
    out = gen.generate(batch, [[1]] * 4, PARAMS, engine)
    templated = tok(tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                            tokenize=False), add_special_tokens=False)["input_ids"]
    note = tok("seen", add_special_tokens=False)["input_ids"]
    first, second = [len(templated), 100, EOS], [len(templated) + 3 + len(note), 101, EOS]
    b = out.batch
    width = b["prompts"].shape[1]
    assert width == 64  # custom loops are registered: prompts widen to rollout.prompt_length
    # the loop's own prompt is re-padded into the batch's width
    assert b["prompts"][0, width - len(templated):].tolist() == templated and b["prompts"][0, 0] == 0
    assert b["attention_mask"][0, :width].tolist() == [0] * (width - len(templated)) + [1] * len(templated)
    n = 6 + len(note)
    assert b["responses"][0, :n].tolist() == first + note + second
    assert b["response_mask"][0].tolist() == [1] * 3 + [0] * len(note) + [1] * 3 + [0] * (16 - n)
    assert b["rollout_log_probs"][0, :n].tolist() == [-0.5] * 3 + [0.0] * len(note) + [-0.5] * 3
    assert len(engine.calls) == 2 and [len(p) for p, _, _ in engine.calls] == [2, 2]  # both loops, batched
    assert list(out.non_tensor_batch["reward_score"]) == [None, 0.75, 0.0, 0.0]
    assert list(out.non_tensor_batch["tool_rewards"])[:2] == [[0.25], [0.25]]
    assert b["response_mask"][2].sum() == 0 and b["response_mask"][3].sum() == 0  # failed rows: empty
    metrics = out.meta_info["metrics"]
    assert metrics["agent/ended_by/error"] == 0.5 and metrics["agent/loop/generate_sequences"] == 0.05


def test_unknown_agent_name_and_bad_yaml_are_one_line_errors(generator, tmp_path):
    gen, tok = generator
    with pytest.raises(ValueError, match=r"row 1: agent_name='nope' is not an agent loop; known: broken, "):
        gen.generate(_batch(tok, ["two_calls", "nope"], [{}, {}]), [[1]] * 2, PARAMS, Recorder())
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  _target_: no_such_pkg.Loop\n")
    with pytest.raises(ValueError, match="entry 0: cannot import _target_ 'no_such_pkg.Loop'"):
        load_agent_loop_config(str(bad))
    bad.write_text("- name: tool_agent\n  _target_: collections.OrderedDict\n")
    with pytest.raises(ValueError, match="'tool_agent' is a built-in loop's name"):
        load_agent_loop_config(str(bad))


def test_server_manager_refuses_images():
    manager = LLMServerManager(BatchingServer(Recorder(), PARAMS, max_model_len=8))
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(manager.generate("r", prompt_ids=[1], sampling_params={}, image_data=["x"]))


def test_params_are_frozen_and_hashable():  # the server groups requests by their GenerationParams
    assert hash(dataclasses.replace(PARAMS, temperature=0.5)) != hash(PARAMS)


def test_an_engine_failure_is_raised_and_fails_the_waiting_agents():
    def broken(token_lists, max_tokens, params):
        raise RuntimeError("engine down")

    async def asks():
        return await server.generate([1])

    server = BatchingServer(broken, PARAMS, max_model_len=64)
    with pytest.raises(RuntimeError, match="engine down"):
        server.run([asks, asks], timeout_s=5)


def test_loops_that_cannot_be_built_fail_at_start_up_in_one_line(tmp_path, monkeypatch):
    from hybrid_rl.agents import agent_loop
    from hybrid_rl.agents.agent_loop import DictConfigWrap, check_agent_loops
    from hybrid_rl.workers.rollout.multi_turn import rollout_config_tree

    monkeypatch.setattr(agent_loop, "_REGISTRY", agent_loop._REGISTRY.copy())  # leave no entry behind
    path = tmp_path / "typo.yaml"
    path.write_text(f"- name: typo_loop\n  _target_: {__name__}.TwoCalls\n  notes: misspelt\n")
    loops = load_agent_loop_config(str(path))
    tree = DictConfigWrap(rollout_config_tree(RolloutConfig(name="hf", response_length=16, prompt_length=64)))
    with pytest.raises(ValueError, match=r"agent loop 'typo_loop' \(.*TwoCalls\): agent loop TwoCalls got "
                                         r"unexpected settings \['notes'\]"):
        check_agent_loops(loops, tree, build_byte_tokenizer())


def test_a_greedy_call_sends_custom_loops_temperature_zero():
    """validation's do_sample=false (and ReMax's greedy baseline) must not sample at the training
    temperature inside a custom loop: veRL's sampling_params then carry temperature 0 (greedy)."""
    import dataclasses

    from hybrid_rl.workers.rollout.multi_turn import verl_sampling_params

    sampled = dataclasses.replace(PARAMS, do_sample=True, temperature=0.7)
    greedy = dataclasses.replace(sampled, do_sample=False)
    assert verl_sampling_params(sampled, True)["temperature"] == 0.7
    assert verl_sampling_params(greedy, False) == {"temperature": 0.0, "top_p": sampled.top_p, "top_k": sampled.top_k,
                                                    "repetition_penalty": 1.0, "logprobs": False}
