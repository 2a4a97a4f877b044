"""``/v1/messages`` driven by the official ``anthropic`` client: tool use round-trips with the earlier call's
exact ids, stop sequences, bad requests answered 400 to their caller alone, and (tiny fp32 model) the
recorded ids and log-probs are what each engine sampled."""

import asyncio

import anthropic
import pytest
import torch

from hybrid_rl.agents.anthropic_route import anthropic_client
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.openai_server import OpenAIEndpoint
from hybrid_rl.agents.server import TokenOutput
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.rollout.base import GenerationParams
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator

EOS = 2
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=5, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=200)
SYSTEM = "Use the calculator."
TOOLS = [{"name": "calculator", "description": "exact arithmetic",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
CALL = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
SEEN: dict[str, object] = {}


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


async def solve(client, row):
    """A Claude-style harness: tool_use -> run the tool -> tool_result -> the answer."""
    claude = anthropic_client(client)
    messages = [{"role": "user", "content": row["raw_prompt"][0]["content"]}]
    first = await claude.messages.create(model="policy", max_tokens=512, system=SYSTEM, messages=messages, tools=TOOLS)
    assert first.stop_reason == "tool_use" and first.content[0].text == "Let me compute."
    use = first.content[1]
    assert use.type == "tool_use" and use.name == "calculator" and use.input == {"expression": "6 * 7"}
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
    second = await claude.messages.create(model="policy", max_tokens=512, system=SYSTEM, messages=messages, tools=TOOLS)
    await claude.close()
    return float(second.stop_reason == "end_turn" and second.content[0].text == "#### 42")


async def bad_then_good(client, row):
    """Sends a field the route does not support, is refused, then asks properly."""
    claude = anthropic_client(client)
    messages = [{"role": "user", "content": row["raw_prompt"][0]["content"]}]
    try:
        await claude.messages.create(model="p", max_tokens=64, messages=messages,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    except anthropic.BadRequestError as exc:
        SEEN["thinking"] = (exc.status_code, exc.body)
    await claude.messages.create(model="p", max_tokens=64, messages=messages)
    await claude.close()
    return 0.5


def _generator(tmp_path, names):
    path = tmp_path / "agents.yaml"
    path.write_text("".join(f"- name: an_{n}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                            f"  agent: {__name__}.{n}\n" for n in names))
    cfg = RolloutConfig(name="hf", response_length=200, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 10})
    return MultiTurnGenerator(cfg, build_byte_tokenizer(), EOS)


def _batch(names):
    ids, mask = torch.ones(len(names), 3, dtype=torch.long), torch.ones(len(names), 3, dtype=torch.long)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                               non_tensors={"agent_name": [f"an_{n}" for n in names],
                                            "raw_prompt": [[{"role": "user", "content": "What is 6*7?"}]] * len(names)})


def test_tool_use_round_trips_and_continues_the_first_calls_exact_ids(tmp_path):
    gen = _generator(tmp_path, ["solve", "bad_then_good"])
    tok = build_byte_tokenizer()
    engine = Scripted(tok)
    out = gen.generate(_batch(["solve", "bad_then_good"]), [[1]] * 2, PARAMS, engine)
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 6*7?"}]
    chat_tools = [{"type": "function", "function": {"name": "calculator", "description": "exact arithmetic",
                                                    "parameters": TOOLS[0]["input_schema"]}}]
    prompt = tok(tok.apply_chat_template(conversation, tools=chat_tools, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok("#### 42", add_special_tokens=False)["input_ids"] + [EOS]
    tool_turn = ObservationEncoder(tok, tok.eos_token).encode([{"role": "tool", "content": "42"}])
    assert prompt in engine.calls and prompt + call + tool_turn in engine.calls  # continued, not re-templated
    width = out.batch["prompts"].shape[1]
    assert out.batch["prompts"][0, width - len(prompt):].tolist() == prompt
    n = len(call) + len(tool_turn) + len(answer)
    assert out.batch["responses"][0, :n].tolist() == call + tool_turn + answer
    assert out.batch["response_mask"][0].tolist() == [1] * len(call) + [0] * len(tool_turn) + [1] * len(answer) + \
        [0] * (200 - n)
    expected = [-0.25 - 0.01 * k for k in range(len(call))] + [0.0] * len(tool_turn) + \
        [-0.25 - 0.01 * k for k in range(len(answer))]
    assert out.batch["rollout_log_probs"][0, :n].tolist() == pytest.approx(expected)
    assert list(out.non_tensor_batch["reward_score"]) == [1.0, 0.5]  # the refused row went on and was scored
    assert SEEN["thinking"] == (400, {"type": "error", "error": {"type": "invalid_request_error", "message": (
        "'thinking' is not supported by hybrid_rl's /v1/messages (supported: cache_control, inference_geo, max_tokens, "
        "messages, metadata, model, service_tier, speed, stop_sequences, stream, system, temperature, tool_choice, "
        "tools, top_k, top_p). Fix: leave 'thinking' out.")}})
    assert out.meta_info["metrics"]["agent/ended_by/error"] == 0.0


class Fixed:
    """A server manager that always samples ``text`` + EOS, log-prob -k/10 at position k."""

    def __init__(self, tok, text):
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + [EOS]
        self.asked = []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.asked.append(dict(sampling_params))
        return TokenOutput(token_ids=list(self.ids), log_probs=[-k / 10 for k in range(len(self.ids))],
                           stop_reason="completed")


def _serve(manager, requests):
    """Send each request (kwargs of messages.create) through the official client; (replies, calls)."""
    tok = build_byte_tokenizer()
    endpoint = OpenAIEndpoint(tok)
    key = endpoint.open(manager, {"temperature": 1.0})

    async def run():
        claude = anthropic.AsyncAnthropic(base_url=endpoint.base_url(key)[:-len("/v1")], api_key="k", max_retries=0,
                                          http_client=anthropic.DefaultAsyncHttpxClient(trust_env=False))
        replies = []
        for kwargs in requests:
            try:
                replies.append(await claude.messages.create(model="p", **kwargs))
            except anthropic.BadRequestError as exc:
                replies.append(exc)
        await claude.close()
        return replies

    try:
        return asyncio.run(run()), endpoint.close(key)
    finally:
        endpoint.shutdown()


def test_stop_sequences_cut_after_the_completing_token_and_keep_the_engines_log_probs():
    tok = build_byte_tokenizer()
    manager = Fixed(tok, "abc</answer>xyz")
    user = [{"role": "user", "content": "q"}]
    after = [{"role": "user", "content": "more"}]
    (reply, again, plain, continued), calls = _serve(manager, [
        dict(max_tokens=50, messages=user, stop_sequences=["</answer>", "zz"],
             extra_body={"temperature": 0.5, "top_k": 3}),  # anthropic 2.x sends sampling settings this way
        dict(max_tokens=50, messages=user + [{"role": "assistant", "content": "abc"}] + after),
        dict(max_tokens=50, messages=user),
        dict(max_tokens=50, messages=user + [{"role": "assistant", "content": "abc</answer>xyz"}] + after)])
    kept = len(tok("abc</answer>", add_special_tokens=False)["input_ids"])  # the token completing the stop: 12th
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "</answer>"
    assert [b.text for b in reply.content] == ["abc"] and reply.usage.output_tokens == kept
    assert calls[0].completion_ids == manager.ids[:kept] and calls[0].log_probs == [-k / 10 for k in range(kept)]
    assert plain.stop_reason == "end_turn" and plain.content[0].text == "abc</answer>xyz"
    # a stop-cut call has no end-of-turn id, so it is not continued (a new chain); an ended one is
    assert [c.parent for c in calls] == [None, None, None, 2]
    assert calls[3].prompt_ids[:len(calls[2].prompt_ids) + kept + 4] == calls[2].prompt_ids + manager.ids
    assert manager.asked[0] == {"temperature": 0.5, "top_k": 3, "max_tokens": 50}


BAD = [
    (dict(max_tokens=0), "max_tokens", "max_tokens=0 is invalid: must be an integer >= 1. Fix: send a positive "
                                       "max_tokens."),
    (dict(max_tokens=8, extra_body={"top_p": -1}), "top_p",
     "top_p=-1 is invalid: must be a number in [0, 1] (0 = greedy, 1 = no nucleus cut). Fix: send a top_p in [0, 1], "
     "or leave it out to use the rollout's."),
    (dict(max_tokens=8, tool_choice={"type": "any"}, tools=TOOLS), "tool_choice",
     "tool_choice.type='any' is not supported by hybrid_rl's /v1/messages: the endpoint cannot force a tool call. "
     "Fix: send {\"type\": \"auto\"} and ask for the tool in the prompt."),
    (dict(max_tokens=8, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools",
     "tools[0].type='web_search_20250305' is not supported: hybrid_rl serves client tools only, which the agent runs "
     "itself. Fix: send a client tool {name, description, input_schema}."),
    (dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]), "messages[0].content[0]",
     "messages[0].content[0].type='image' is not supported by hybrid_rl's /v1/messages (text and tool_result blocks "
     "only: the rollout is text-only). Fix: send the content as text."),
    (dict(max_tokens=8, messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]),
     "messages[1]", "messages[1] is an assistant turn last (a prefill), which hybrid_rl's /v1/messages does not "
                    "continue. Fix: end with a user turn."),
    (dict(max_tokens=8, stop_sequences=[""]), "stop_sequences",
     "stop_sequences=[''] is invalid: must be a list of non-empty strings. Fix: send e.g. [\"</answer>\"]."),
]


def test_bad_requests_are_answered_400_naming_the_field_and_record_nothing():
    tok = build_byte_tokenizer()
    user = [{"role": "user", "content": "q"}]
    requests = [{"messages": user, **kwargs} for kwargs, _, _ in BAD] + [dict(max_tokens=8, messages=user)]
    replies, calls = _serve(Fixed(tok, "ok"), requests)
    for (kwargs, param, message), reply in zip(BAD, replies):
        assert isinstance(reply, anthropic.BadRequestError) and reply.status_code == 400, param
        assert reply.body == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}, param
    assert replies[-1].content[0].text == "ok" and len(calls) == 1  # the key still serves; nothing else recorded


def _stream_refused():
    """stream=true is refused (a raw POST: the client would read the answer as an event stream)."""
    import httpx

    endpoint = OpenAIEndpoint(build_byte_tokenizer())
    key = endpoint.open(Fixed(build_byte_tokenizer(), "ok"), {})
    try:
        answer = httpx.post(f"{endpoint.base_url(key)}/messages", trust_env=False, json={
            "model": "p", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "q"}]})
        missing = httpx.post(f"{endpoint.base_url(key)}/messages", trust_env=False, json={
            "model": "p", "messages": [{"role": "user", "content": "q"}]})
    finally:
        endpoint.shutdown()
    return answer, missing


def test_stream_and_a_missing_max_tokens_are_refused():
    answer, missing = _stream_refused()
    assert answer.status_code == 400 and answer.json()["error"]["message"] == (
        "stream=true is not supported by hybrid_rl's /v1/messages: completions are recorded whole. Fix: stream=false")
    assert missing.status_code == 400 and missing.json()["error"]["message"] == (
        "max_tokens is required by /v1/messages. Fix: send max_tokens, e.g. 1024 (the row's response budget caps it)")


_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]


async def one_message(client, row):
    """The single-turn call through /v1/messages."""
    claude = anthropic_client(client)
    await claude.messages.create(model="policy", max_tokens=1024, messages=list(row["raw_prompt"]))
    await claude.close()


def same_as_builtin(engine_name, tiny_model_dir, tmp_path, agent_path):
    """(rows of ``agent_path``'s agent, the built-in single-turn rows) on one engine, same seed and prompts."""
    from hybrid_rl.workers.model_loader import load_tokenizer

    path = tmp_path / "agents.yaml"
    path.write_text(f"- name: route_one_call\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                    f"  agent: {agent_path}\n")
    tok = load_tokenizer(tiny_model_dir)
    questions = ["q one", "question two", "3"]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"] for q in questions]
    width = max(map(len, prompts))
    cfg = RolloutConfig(name=engine_name, dtype="float32", response_length=12, prompt_length=width,
                        calculate_log_probs=True, max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0,
                        temperature=1.0, agent={"agent_loop_config_path": str(path)})
    engine = build_rollout(cfg, tiny_model_dir, tok, "cpu")

    def batch(agent_name):
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return DataProto.from_dict(
            {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
            non_tensors={"agent_name": [agent_name] * 3, "raw_prompt": [[{"role": "user", "content": q}]
                                                                       for q in questions]},
            meta_info={"eos_token_id": [1], "pad_token_id": 0, "do_sample": True, "seed": 99, "global_steps": 1})

    try:
        return engine.generate_sequences(batch("route_one_call")), engine.generate_sequences(batch("single_turn_agent"))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("engine_name", ENGINES)
def test_messages_route_records_exactly_what_the_engine_sampled(engine_name, tiny_model_dir, tmp_path):
    routed, builtin = same_as_builtin(engine_name, tiny_model_dir, tmp_path, f"{__name__}.one_message")
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(routed.batch[key], builtin.batch[key]), (engine_name, key)
    assert (routed.batch["rollout_log_probs"] * routed.batch["response_mask"] < 0).any()  # real log-probs
    assert routed.meta_info["metrics"]["agent/ended_by/error"] == 0.0


def test_messages_translate_into_the_chat_templates_form():
    from hybrid_rl.agents.anthropic_route import chat_messages

    body = {"system": [{"type": "text", "text": "Be exact."}, {"type": "text", "text": "Use tools.", "cache_control": {
        "type": "ephemeral"}}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "6*7?"}, {"type": "text", "text": "And 2+2?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Computing."},
            {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"e": "6*7"}},
            {"type": "tool_use", "id": "toolu_2", "name": "calc", "input": {"e": "2+2"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2",
                                      "content": [{"type": "text", "text": "4"}]},
                                     {"type": "text", "text": "Now answer."}]}]}
    assert chat_messages(body) == [
        {"role": "system", "content": "Be exact.\nUse tools."},
        {"role": "user", "content": "6*7?\nAnd 2+2?"},
        {"role": "assistant", "content": "Computing.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "6*7"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}]},
        {"role": "tool", "content": "42", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "4", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "Now answer."}]
