"""Black-box agents over the OpenAI-compatible endpoint, driven by the official ``openai`` client: exact
ids and log-probs, continued conversations, tool calls, and agents that fail without failing the step."""

import asyncio
import json

import openai
import pytest
import torch

from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.base import GenerationParams
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from hybrid_rl.utils.testing import build_byte_tokenizer

EOS = 2
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=5, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=200)
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "exact arithmetic",
                                           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


class Scripted:
    """A turn_fn: the first call of a conversation answers CALL, a continued one '#### 42'; records calls."""

    def __init__(self, tok, call=CALL):
        self.tok, self.calls, self.call = tok, [], call

    def __call__(self, token_lists, max_tokens, params):
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            self.calls.append(list(tokens))
            text = self.call if "<|im_start|>tool" not in self.tok.decode(tokens) else "#### 42"
            ids = (self.tok(text, add_special_tokens=False)["input_ids"] + [EOS])[:limit]
            out.append((ids, [-0.25 - 0.01 * k for k in range(len(ids))]))
        return out


async def solve(client: openai.AsyncOpenAI, row):
    """Calls the model, runs the requested tool, sends the result back, scores the answer."""
    messages = list(row["raw_prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, logprobs=True)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "calculator"
    assert json.loads(message.tool_calls[0].function.arguments) == {"expression": "6 * 7"}
    assert first.choices[0].logprobs.content[0].logprob == pytest.approx(-0.25)
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "content": "42", "tool_call_id": message.tool_calls[0].id}]
    second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return {"reward": float(second.choices[0].message.content.strip() == "#### 42"), "tool_uses": 1}


async def side_call_then_answer(client, row):
    """An independent sub-agent call, then the main conversation: the side call is not in the row."""
    messages = list(row["raw_prompt"])
    await asyncio.gather(client.completions.create(model="p", prompt=[7, 8, 9], max_tokens=3),
                         client.chat.completions.create(model="p", messages=messages))
    return 0.5


async def raises(client, row):
    await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]))
    raise RuntimeError("agent bug")


async def hangs(client, row):
    await asyncio.sleep(60)


async def garbage(client, row):
    await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]))
    return "great"


async def never_calls(client, row):
    return 1.0


async def streams(client, row):
    try:
        await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]), stream=True)
    except openai.BadRequestError as exc:
        refused = float("stream=true is not supported" in str(exc))
    else:
        refused = 0.0
    await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]))
    return {"reward": 0.25, "refused": refused}


AGENTS = ["solve", "side_call_then_answer", "raises", "hangs", "garbage", "never_calls", "streams"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("openai") / "agents.yaml"
    path.write_text("".join(f"- name: oa_{name}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                            f"  agent: {__name__}.{name}\n" for name in AGENTS))
    cfg = RolloutConfig(name="hf", response_length=200, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 3})
    tok = build_byte_tokenizer()
    return MultiTurnGenerator(cfg, tok, EOS), tok


def _batch(names):
    n = len(names)
    ids, mask = torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                               non_tensors={"agent_name": [f"oa_{a}" for a in names],
                                            "raw_prompt": [[{"role": "user", "content": f"What is 6*7? ({a})"}]
                                                           for a in names]})


def test_endpoint_rows_record_exact_ids_and_continue_conversations(setup):
    gen, tok = setup
    engine = Scripted(tok)
    out = gen.generate(_batch(["solve", "side_call_then_answer"]), [[1]] * 2, PARAMS, engine)
    messages = [{"role": "user", "content": "What is 6*7? (solve)"}]
    prompt = tok(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok("#### 42", add_special_tokens=False)["input_ids"] + [EOS]
    tool_turn = ObservationEncoder(tok, tok.eos_token).encode([{"role": "tool", "content": "42"}])
    assert engine.calls[0] == prompt or engine.calls[1] == prompt  # the first call: the templated prompt
    assert prompt + call + tool_turn in engine.calls  # the continued call: the first call's exact ids + the delta
    b, width = out.batch, out.batch["prompts"].shape[1]
    assert b["prompts"][0, width - len(prompt):].tolist() == prompt
    n = len(call) + len(tool_turn) + len(answer)
    assert b["responses"][0, :n].tolist() == call + tool_turn + answer
    assert b["response_mask"][0].tolist() == [1] * len(call) + [0] * len(tool_turn) + [1] * len(answer) + [0] * (200 - n)
    expected_lp = [-0.25 - 0.01 * k for k in range(len(call))] + [0.0] * len(tool_turn) + \
                  [-0.25 - 0.01 * k for k in range(len(answer))]
    assert b["rollout_log_probs"][0, :n].tolist() == pytest.approx(expected_lp)
    assert list(out.non_tensor_batch["reward_score"]) == [1.0, 0.5]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/loop/calls"] == 2.0 and metrics["agent/loop/calls_off_row"] == 0.5
    assert metrics["agent/loop/tool_uses"] == 0.5 and metrics["agent/ended_by/error"] == 0.0
    assert [7, 8, 9] in engine.calls  # /v1/completions with token ids: used exactly


def test_failing_agents_score_zero_and_are_counted(setup):
    gen, tok = setup
    names = ["raises", "hangs", "garbage", "never_calls", "streams"]
    out = gen.generate(_batch(names), [[1]] * len(names), PARAMS, Scripted(tok))
    assert list(out.non_tensor_batch["reward_score"]) == [0.0, 0.0, 0.0, 0.0, 0.25]
    assert out.batch["response_mask"][:4].sum() == 0
    metrics = out.meta_info["metrics"]
    assert metrics["agent/ended_by/error"] == pytest.approx(0.8)
    assert metrics["agent/loop/refused"] == pytest.approx(0.2)  # stream=true answered 400 in one line


MISTRAL_CALL = 'Computing.[TOOL_CALLS]calculator[ARGS]{"expression": "6 * 7"}'


def test_the_endpoint_reads_tool_calls_in_the_runs_format(tmp_path):
    from hybrid_rl.agents.openai_server import OpenAIEndpoint
    from hybrid_rl.agents.server import TokenOutput

    path = tmp_path / "agents.yaml"  # rollout.multi_turn.format reaches the endpoint through the loop
    path.write_text(f"- name: oa_solve\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                    f"  agent: {__name__}.solve\n")
    cfg = RolloutConfig(name="hf", response_length=200, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 3}, multi_turn={"format": "mistral"})
    tok = build_byte_tokenizer()
    out = MultiTurnGenerator(cfg, tok, EOS).generate(_batch(["solve"]), [[1]], PARAMS, Scripted(tok, MISTRAL_CALL))
    assert list(out.non_tensor_batch["reward_score"]) == [1.0]

    class Manager:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return TokenOutput(token_ids=tok(MISTRAL_CALL, add_special_tokens=False)["input_ids"] + [EOS],
                               log_probs=None, stop_reason="completed")

    endpoint = OpenAIEndpoint(tok)
    try:
        replies = {}
        for fmt in ("mistral", "hermes"):
            key = endpoint.open(Manager(), {}, tool_format=fmt)
            body = {"messages": [{"role": "user", "content": "6*7?"}], "tools": TOOLS}
            replies[fmt] = asyncio.run(endpoint.chat(key, body))["choices"][0]
            endpoint.close(key)
        with pytest.raises(ValueError, match="mistral"):
            endpoint.open(Manager(), {}, tool_format="json")
    finally:
        endpoint.shutdown()
    message = replies["mistral"]["message"]
    assert replies["mistral"]["finish_reason"] == "tool_calls" and message["content"] == "Computing."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("calculator", {"expression": "6 * 7"})]
    assert "tool_calls" not in replies["hermes"]["message"]  # another format's syntax is plain text
    assert replies["hermes"]["message"]["content"].startswith("Computing.[TOOL_CALLS]")


def test_a_chain_of_calls_is_cut_to_the_rows_budget():
    from hybrid_rl.agents.openai_server import OpenAIEndpoint
    from hybrid_rl.agents.server import TokenOutput

    tok = build_byte_tokenizer()
    asked = []

    class Manager:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            asked.append((len(prompt_ids), sampling_params["max_tokens"]))
            return TokenOutput(token_ids=tok("ok", add_special_tokens=False)["input_ids"] + [EOS], log_probs=None,
                               stop_reason="completed")

    endpoint = OpenAIEndpoint(tok)
    try:
        key = endpoint.open(Manager(), {"temperature": 1.0}, budget=40)
        messages = [{"role": "user", "content": "hi"}]
        first = asyncio.run(endpoint.chat(key, {"messages": messages, "max_tokens": 100}))
        messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
        asyncio.run(endpoint.chat(key, {"messages": messages}))
        calls = endpoint.close(key)
    finally:
        endpoint.shutdown()
    added = len(calls[1].prompt_ids) - len(calls[0].prompt_ids)  # the first reply and the new user turn
    assert calls[1].parent == 0 and asked == [(len(calls[0].prompt_ids), 40), (len(calls[1].prompt_ids), 40 - added)]


def test_the_row_is_the_longest_chain_and_an_overrunning_continuation_is_left_out():
    from hybrid_rl.agents.openai_agent import output_from_calls
    from hybrid_rl.agents.openai_server import CallRecord, OpenAIEndpoint
    from hybrid_rl.agents.server import TokenOutput

    main = [CallRecord([1, 2], [3, EOS], [-1.0, -1.0], "completed", started=1),
            CallRecord([1, 2, 3, EOS, 9], [4, EOS], [-2.0, -2.0], "completed", parent=0, started=2),
            CallRecord([7], [8, EOS], [-3.0, -3.0], "completed", started=3)]  # a judge call, requested last
    out = output_from_calls(main, 1.0)
    assert out.prompt_ids == [1, 2] and out.response_ids == [3, EOS, 9, 4, EOS]
    assert out.response_mask == [1, 1, 0, 1, 1] and out.response_logprobs == [-1.0, -1.0, 0.0, -2.0, -2.0]
    assert out.metrics == {"calls": 3.0, "calls_off_row": 1.0} and out.reward_score == 1.0

    tok = build_byte_tokenizer()

    class Manager:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return TokenOutput(token_ids=[5, EOS], log_probs=None, stop_reason="completed")

    endpoint = OpenAIEndpoint(tok)
    try:
        key = endpoint.open(Manager(), {}, budget=8)
        messages = [{"role": "user", "content": "hi"}]
        first = asyncio.run(endpoint.chat(key, {"messages": messages}))
        messages += [first["choices"][0]["message"], {"role": "user", "content": "a long new user turn " * 3}]
        second = asyncio.run(endpoint.chat(key, {"messages": messages}))
        calls = endpoint.close(key)
    finally:
        endpoint.shutdown()
    assert second["choices"][0]["finish_reason"] == "length" and second["choices"][0]["message"]["content"] == ""
    assert len(calls) == 1  # the overrunning continuation is not part of the row
