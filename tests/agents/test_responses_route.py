"""``/v1/responses`` driven by the official ``openai`` client: function calls as output items, continued by
``previous_response_id`` or by resending the conversation, both from the earlier call's exact ids; bad
requests answered 400 to their caller alone; (tiny fp32 model) the recorded ids and log-probs are what
each engine sampled."""

import asyncio
import json

import httpx
import openai
import pytest
import torch

from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.openai_server import OpenAIEndpoint
from hybrid_rl.agents.server import TokenOutput
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer
from hybrid_rl.workers.rollout import RolloutConfig
from hybrid_rl.workers.rollout.base import GenerationParams
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from tests.agents.test_anthropic_route import ENGINES, same_as_builtin

EOS = 2
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=5, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=200)
INSTRUCTIONS = "Use the calculator."
TOOLS = [{"type": "function", "name": "calculator", "description": "exact arithmetic",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


class Scripted:
    """A turn_fn: a conversation without a tool turn answers CALL, one with a tool turn '#### 42'."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def __call__(self, token_lists, max_tokens, params):
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            self.calls.append(list(tokens))
            text = CALL if "<|im_start|>tool" not in self.tok.decode(tokens) else "#### 42"
            ids = (self.tok(text, add_special_tokens=False)["input_ids"] + [EOS])[:limit]
            out.append((ids, [-0.25 - 0.01 * k for k in range(len(ids))]))
        return out


def _check_call(first):
    """The first response: one function_call item (no prose before it), status completed."""
    assert first.status == "completed" and [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "6 * 7"}
    return call


async def chained(client, row):
    """A Codex-style harness: function_call -> run it -> function_call_output with previous_response_id."""
    question = row["raw_prompt"][0]["content"]
    first = await client.responses.create(model="policy", instructions=INSTRUCTIONS, input=question, tools=TOOLS)
    call = _check_call(first)
    second = await client.responses.create(
        model="policy", instructions=INSTRUCTIONS, tools=TOOLS, previous_response_id=first.id,
        include=["message.output_text.logprobs"],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}])
    logprobs = [lp.logprob for lp in second.output[0].content[0].logprobs]
    assert logprobs == pytest.approx([-0.25 - 0.01 * k for k in range(len(logprobs))])
    return float(second.output_text == "#### 42")


async def resent(client, row):
    """A stateless harness (store=false): resends the whole conversation, its function_call item included."""
    items = [{"role": "user", "content": row["raw_prompt"][0]["content"]}]
    first = await client.responses.create(model="policy", instructions=INSTRUCTIONS, input=items, tools=TOOLS,
                                          store=False)
    call = _check_call(first)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "42"})
    second = await client.responses.create(model="policy", instructions=INSTRUCTIONS, input=items, tools=TOOLS,
                                           store=False)
    return float(second.output_text == "#### 42")


async def bad_then_good(client, row):
    """Asks for reasoning, is refused, then asks properly: its row is trained on."""
    try:
        await client.responses.create(model="p", input="q", reasoning={"effort": "low"})
    except openai.BadRequestError:
        pass
    await client.responses.create(model="p", input="q")
    return 0.5


def test_function_calls_round_trip_and_continue_the_first_calls_exact_ids(tmp_path):
    names = ["chained", "resent", "bad_then_good"]
    path = tmp_path / "agents.yaml"
    path.write_text("".join(f"- name: rs_{n}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                            f"  agent: {__name__}.{n}\n" for n in names))
    cfg = RolloutConfig(name="hf", response_length=200, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 10})
    tok = build_byte_tokenizer()
    ids, mask = torch.ones(3, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long)
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                                non_tensors={"agent_name": [f"rs_{n}" for n in names],
                                             "raw_prompt": [[{"role": "user", "content": "What is 6*7?"}]] * 3})
    engine = Scripted(tok)
    out = MultiTurnGenerator(cfg, tok, EOS).generate(batch, [[1]] * 3, PARAMS, engine)
    conversation = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "What is 6*7?"}]
    prompt = tok(tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok("#### 42", add_special_tokens=False)["input_ids"] + [EOS]
    tool_turn = ObservationEncoder(tok, tok.eos_token).encode([{"role": "tool", "content": "42"}])
    assert engine.calls.count(prompt + call + tool_turn) == 2  # both rows continued, never re-templated
    n = len(call) + len(tool_turn) + len(answer)
    width = out.batch["prompts"].shape[1]
    for row in (0, 1):
        assert out.batch["prompts"][row, width - len(prompt):].tolist() == prompt
        assert out.batch["responses"][row, :n].tolist() == call + tool_turn + answer
        assert out.batch["response_mask"][row].tolist() == [1] * len(call) + [0] * len(tool_turn) + \
            [1] * len(answer) + [0] * (200 - n)
        expected = [-0.25 - 0.01 * k for k in range(len(call))] + [0.0] * len(tool_turn) + \
            [-0.25 - 0.01 * k for k in range(len(answer))]
        assert out.batch["rollout_log_probs"][row, :n].tolist() == pytest.approx(expected)
    assert list(out.non_tensor_batch["reward_score"]) == [1.0, 1.0, 0.5]
    assert out.meta_info["metrics"]["agent/ended_by/error"] == 0.0


class Fixed:
    """A server manager that samples ``text`` + EOS (or ``text`` alone, cut by length)."""

    def __init__(self, tok, text, ended=True):
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + ([EOS] if ended else [])
        self.ended = ended

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        return TokenOutput(token_ids=list(self.ids), log_probs=[-k / 10 for k in range(len(self.ids))],
                           stop_reason="completed" if self.ended else "length")


def _serve(manager, requests):
    """Send each request (kwargs of responses.create) through the official client; (replies, calls)."""
    endpoint = OpenAIEndpoint(build_byte_tokenizer())
    key = endpoint.open(manager, {})

    async def run():
        client = openai.AsyncOpenAI(base_url=endpoint.base_url(key), api_key="k", max_retries=0,
                                    http_client=httpx.AsyncClient(trust_env=False))
        replies = []
        for kwargs in requests:
            try:
                replies.append(await client.responses.create(model="p", **kwargs))
            except openai.BadRequestError as exc:
                replies.append(exc)
        await client.close()
        return replies

    try:
        return asyncio.run(run()), endpoint.close(key)
    finally:
        endpoint.shutdown()


def test_a_reply_cut_by_the_length_limit_is_incomplete():
    tok = build_byte_tokenizer()
    (reply,), calls = _serve(Fixed(tok, "abcd", ended=False), [dict(input="q", max_output_tokens=4)])
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == "abcd" and reply.output[0].status == "incomplete"
    assert reply.usage.output_tokens == 4 and calls[0].completion_ids == tok("abcd", add_special_tokens=False)[
        "input_ids"]


BAD = [
    (dict(input="q", reasoning={"effort": "low"}), "reasoning",
     "'reasoning' is not supported by hybrid_rl's /v1/responses (supported: include, input, instructions, "
     "max_output_tokens, metadata, model, parallel_tool_calls, previous_response_id, store, stream, temperature, text, "
     "tool_choice, tools, top_p, truncation, user). Fix: leave 'reasoning' out."),
    (dict(input="q", previous_response_id="resp_unknown"), "previous_response_id",
     "previous_response_id='resp_unknown' is not a response of this row (responses are kept per row until its rollout "
     "ends). Fix: send the id of a response this row's agent received, or the whole conversation as input."),
    (dict(input="q", tools=[{"type": "web_search"}]), "tools",
     "tools[0].type='web_search' is not supported: hybrid_rl serves client tools only, which the agent runs itself. "
     "Fix: send a function tool {type: function, name, description, parameters}."),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
     "input[0].content[0]", "input[0].content[0].type='input_image' is not supported by hybrid_rl's /v1/responses "
                            "(input_text and output_text parts only: the rollout is text-only). Fix: send the content "
                            "as text."),
    (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type",
     "input[0].type='item_reference' is not supported by hybrid_rl's /v1/responses (message, function_call and "
     "function_call_output items only). Fix: send those items, or previous_response_id for earlier turns."),
    (dict(input="q", tools=TOOLS, tool_choice="required"), "tool_choice",
     "tool_choice=required is not supported by hybrid_rl's /v1/responses: the endpoint cannot force a tool call. "
     "Fix: send 'auto' and ask for the tool in the prompt."),
    (dict(input="q", max_output_tokens=0), "max_output_tokens",
     "max_output_tokens=0 is invalid: must be an integer >= 1. Fix: send a positive max_output_tokens."),
    (dict(input="q", truncation="auto"), "truncation",
     "truncation='auto' is not supported: hybrid_rl never drops turns from a recorded conversation. "
     "Fix: truncation='disabled'."),
    (dict(input="q", top_p=-1.0), "top_p",
     "top_p=-1.0 is invalid: must be a number in [0, 1] (0 = greedy, 1 = no nucleus cut). Fix: send a top_p in "
     "[0, 1], or leave it out to use the rollout's."),
]


def test_bad_requests_are_answered_400_naming_the_field_and_record_nothing():
    requests = [kwargs for kwargs, _, _ in BAD] + [dict(input="q")]
    replies, calls = _serve(Fixed(build_byte_tokenizer(), "ok"), requests)
    for (_, param, message), reply in zip(BAD, replies):
        assert isinstance(reply, openai.BadRequestError) and reply.status_code == 400, param
        assert reply.body == {"message": message, "type": "invalid_request_error", "param": param,
                              "code": "invalid_value"}, param
    assert replies[-1].output_text == "ok" and len(calls) == 1  # the key still serves; nothing else recorded


async def one_response(client, row):
    """The single-turn call through /v1/responses."""
    await client.responses.create(model="policy", input=row["raw_prompt"][0]["content"])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_responses_route_records_exactly_what_the_engine_sampled(engine_name, tiny_model_dir, tmp_path):
    routed, builtin = same_as_builtin(engine_name, tiny_model_dir, tmp_path, f"{__name__}.one_response")
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(routed.batch[key], builtin.batch[key]), (engine_name, key)
    assert (routed.batch["rollout_log_probs"] * routed.batch["response_mask"] < 0).any()  # real log-probs
    assert routed.meta_info["metrics"]["agent/ended_by/error"] == 0.0


def test_input_items_translate_into_the_chat_templates_form():
    from hybrid_rl.agents.responses_route import chat_input

    items = [{"role": "developer", "content": "Be exact."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "6*7?"},
                                                             {"type": "input_text", "text": "And 2+2?"}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Computing.", "annotations": []}]},
             {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": '{"e": "6*7"}'},
             {"type": "function_call", "call_id": "call_2", "name": "calc", "arguments": '{"e": "2+2"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "42"},
             {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "4"}]},
             {"type": "function_call", "call_id": "call_3", "name": "calc", "arguments": "{}"}]
    assert chat_input(items) == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "6*7?\nAnd 2+2?"},
        {"role": "assistant", "content": "Computing.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "6*7"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "tool", "content": "4", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "", "tool_calls": [  # a call after a tool turn opens a new assistant turn
            {"id": "call_3", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]}]
    assert chat_input("hi") == [{"role": "user", "content": "hi"}]
