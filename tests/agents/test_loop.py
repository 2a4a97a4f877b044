"""The multi-turn loop with a scripted engine: layout, masks, token faithfulness, limits, bad tools."""

import asyncio
import threading

import pytest

from hybrid_rl.agents import AgentLoop, BaseInteraction, BaseTool, MultiTurnConfig, RowContext
from hybrid_rl.agents.calculator import CalculatorTool
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.utils.testing import build_byte_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def ids(tok, text, eos=True):
    return tok(text, add_special_tokens=False)["input_ids"] + ([EOS] if eos else [])


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "317 * 46"}}</tool_call>'


class Script:
    """An engine that answers row r's k-th turn with script[r][k] and records every request."""

    def __init__(self, tok, script, eos=True):
        self.turns = [[ids(tok, t, eos) for t in row] for row in script]
        self.requests = []

    def __call__(self, token_lists, max_tokens, turn):
        self.requests.append((token_lists, max_tokens, turn))
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            row = next(r for r, first in enumerate(self.first) if tokens[:len(first)] == first)
            k = self.seen[row]
            self.seen[row] += 1
            new = self.turns[row][k][:limit]
            out.append((new, [-0.5] * len(new)))
        return out

    def bind(self, prompts):
        self.first, self.seen = prompts, [0] * len(prompts)
        return self


class Echo(BaseTool):
    def __init__(self, behaviour):
        super().__init__(tool_schema={"type": "function", "function": {"name": "calculator"}})
        self.behaviour = behaviour

    async def execute(self, instance_id, parameters, **kwargs):
        return await self.behaviour()


def loop(tok, tools=None, interactions=None, **cfg):
    return AgentLoop(MultiTurnConfig(enable=True, **cfg), tok, tools if tools is not None else
                     {"calculator": CalculatorTool()}, interactions or {}, [EOS])


def test_observation_delta_follows_the_template(tok):
    enc = ObservationEncoder(tok, "<|im_end|>")
    assert enc.delta_text([{"role": "tool", "content": "14582"}]) == \
        "\n<|im_start|>tool\n14582<|im_end|>\n<|im_start|>assistant\n"
    # the delta after the sampled turn reproduces the templated conversation exactly
    prompt = [{"role": "user", "content": "q"}]
    head = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "7"}],
                                   add_generation_prompt=True, tokenize=False)
    assert head + "a<|im_end|>" + enc.delta_text([{"role": "tool", "content": "7"}]) == full


def test_no_chat_template_is_one_clear_line(tok):
    class Bare:
        chat_template = None

    with pytest.raises(ValueError, match="multi_turn.enable=true needs a tokenizer with a chat template"):
        ObservationEncoder(Bare(), "</s>")


def test_trajectory_layout_masks_and_faithful_ids(tok):
    prompts = [ids(tok, "P0:", eos=False), ids(tok, "P1:", eos=False)]
    engine = Script(tok, [[CALL, "#### 14582"], ["no tool #### 1"]]).bind(prompts)
    rows = [RowContext(tools_kwargs={"calculator": {"create_kwargs": {"ground_truth": 14582}}}), RowContext()]
    t0, t1 = loop(tok).run(prompts, rows, engine, budget=400)
    obs = ObservationEncoder(tok, "<|im_end|>").encode([{"role": "tool", "content": "14582"}])
    turn1, turn2 = ids(tok, CALL), ids(tok, "#### 14582")
    assert t0.response_ids == turn1 + obs + turn2  # the sampled ids, exactly, around the observation
    assert t0.response_mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert t0.log_probs == [-0.5] * len(turn1) + [0.0] * len(obs) + [-0.5] * len(turn2)
    # turn 2 was asked to continue exactly prompt + turn 1 + observation, with the remaining budget
    (second,) = [(lists, limits) for lists, limits, turn in engine.requests if turn == 1]
    assert second == ([prompts[0] + turn1 + obs], [400 - len(turn1) - len(obs)])
    assert (t0.end_reason, t0.num_turns, t0.tool_calls, t0.tool_rewards) == ("stop", 4, 1, [0.0, 1.0])
    assert t0.tool_metrics == {"tool/calculator/error": 0.0, "tool/calculator/correct": 1.0}
    assert (t1.end_reason, t1.response_mask, t1.num_turns) == ("stop", [1] * len(ids(tok, "no tool #### 1")), 2)


@pytest.mark.parametrize("behaviour, kind, fragment", [
    ("raise", "tool_errors", "Error when executing tool 'calculator': RuntimeError: bad"),
    ("hang", "tool_timeouts", "no answer within 0.2 s"),
    ("block", "tool_timeouts", "blocked its event loop"),
    ("bytes", "tool_errors", "returned bytes instead of text"),
    ("huge", None, "...(truncated)..."),
])
def test_bad_tools_become_error_observations(tok, behaviour, kind, fragment):
    released = threading.Event()

    async def act():
        if behaviour == "raise":
            raise RuntimeError("bad")
        if behaviour == "hang":
            await asyncio.sleep(3600)
        if behaviour == "block":
            released.wait(60)  # synchronous: blocks the event loop far past the timeout
        if behaviour == "bytes":
            return b"\x00", 0.0, {}
        return "x" * 100_000, 0.0, {}

    # a tool that must time out gets 0.2 s; one that must answer, a budget no loaded machine exhausts
    timeout_s = 0.2 if behaviour in ("hang", "block") else 30
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[CALL, "done"]]).bind(prompts)
    try:
        (t,) = loop(tok, {"calculator": Echo(act)}, tool_timeout_s=timeout_s, max_tool_response_length=64).run(
            prompts, [RowContext()], engine, budget=2000)
    finally:
        released.set()  # let an abandoned event loop go
    observation = tok.decode([x for x, m in zip(t.response_ids, t.response_mask) if m == 0])
    assert fragment in observation and t.end_reason == "stop"
    if kind:
        assert getattr(t, kind) == 1
    else:
        assert len(observation) < 200


@pytest.mark.parametrize("text, fragment", [
    ('<tool_call>{"name": "calculator", "arguments": </tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "unknown tool 'search'; available: calculator"),
    (CALL + CALL, "at most 1 tool call(s) per turn"),
])
def test_malformed_unknown_and_extra_calls(tok, text, fragment):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[text, "done"]]).bind(prompts)
    (t,) = loop(tok).run(prompts, [RowContext()], engine, budget=2000)
    observation = tok.decode([x for x, m in zip(t.response_ids, t.response_mask) if m == 0])
    assert fragment in observation and t.tool_errors == 1 and t.end_reason == "stop"


@pytest.mark.parametrize("cfg, budget, reason, turns", [
    ({"max_assistant_turns": 2}, 5000, "max_assistant_turns", 2),
    ({"max_user_turns": 1}, 5000, "max_user_turns", 2),
    ({}, 150, "length", None),
])
def test_limits_end_cleanly(tok, cfg, budget, reason, turns):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[CALL] * 10]).bind(prompts)
    (t,) = loop(tok, **cfg).run(prompts, [RowContext()], engine, budget=budget)
    assert t.end_reason == reason and len(t.response_ids) <= budget
    if turns is not None:
        assert t.assistant_turns == turns
    assert t.response_mask[-1] == 1  # an observation that cannot be answered is not kept


def test_turn_without_eos_ends_by_length(tok):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [["rambling"]], eos=False).bind(prompts)
    (t,) = loop(tok).run(prompts, [RowContext()], engine, budget=100)
    assert t.end_reason == "length"


def test_single_turn_agent_rows_get_one_turn(tok):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[CALL, "x"]]).bind(prompts)
    (t,) = loop(tok).run(prompts, [RowContext(agent_name="single_turn_agent")], engine, budget=500)
    assert (t.assistant_turns, t.end_reason, t.tool_calls) == (1, "stop", 0)


class Teacher(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        done = "42" in messages[-1]["content"]
        return done, "Try again.", 1.0 if done else 0.0, {}


def test_interaction_replies_are_masked_user_turns(tok):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [["41", "42"]]).bind(prompts)
    rows = [RowContext(interaction_kwargs={"name": "teacher"}, messages=[{"role": "user", "content": "q"}])]
    (t,) = loop(tok, tools={}, interactions={"teacher": Teacher({"name": "teacher"})}).run(
        prompts, rows, engine, budget=500)
    reply = ObservationEncoder(tok, "<|im_end|>").encode([{"role": "user", "content": "Try again."}])
    assert t.response_ids == ids(tok, "41") + reply + ids(tok, "42")
    assert (t.turn_scores, t.end_reason, t.user_turns) == ([0.0, 1.0], "interaction", 1)


def test_unknown_interaction_name_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="interaction_kwargs.name='judge' is not a configured interaction"):
        loop(tok, tools={}, interactions={"teacher": Teacher()}).run(
            [[1]], [RowContext(interaction_kwargs={"name": "judge"})], Script(tok, [["x"]]).bind([[1]]), budget=10)


def test_an_answer_that_fills_the_budget_exactly_is_a_stop(tok):
    answer = "#### 14582"
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[answer]]).bind(prompts)
    (t,) = loop(tok).run(prompts, [RowContext()], engine, budget=len(ids(tok, answer)))
    assert t.end_reason == "stop" and t.response_ids == ids(tok, answer)
    engine = Script(tok, [[CALL]]).bind(prompts)  # a call with no budget left for its result
    (t,) = loop(tok).run(prompts, [RowContext()], engine, budget=len(ids(tok, CALL)))
    assert t.end_reason == "length" and t.tool_calls == 1 and t.response_mask == [1] * len(ids(tok, CALL))


class Weird(BaseTool):
    """A tool whose every method misbehaves in its own way."""

    created = 0

    def __init__(self, create_fails=False):
        super().__init__(tool_schema={"type": "function", "function": {"name": "calculator"}})
        self.create_fails = create_fails

    async def create(self, instance_id=None, **kwargs):
        if self.create_fails:
            raise RuntimeError("no instance for you")
        Weird.created += 1
        await asyncio.sleep(0.01)  # parallel calls would race here without the creation round
        return await super().create(instance_id)

    async def execute(self, instance_id, parameters, **kwargs):
        return "ok", 10**400, {"m": "not a number", "n": float("nan"), "big": 10**400, "good": 2}

    async def calc_reward(self, instance_id, **kwargs):
        return float("nan")


def test_misbehaving_tool_values_never_crash(tok):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [[CALL + CALL, "done"]]).bind(prompts)
    Weird.created = 0
    (t,) = loop(tok, {"calculator": Weird()}, max_parallel_calls=2).run(prompts, [RowContext()], engine, budget=2000)
    assert Weird.created == 1 and t.tool_calls == 2  # two parallel calls, one instance
    assert t.tool_errors == 2 and t.tool_rewards == []  # 10**400 is no reward; the NaN calc_reward is dropped
    engine = Script(tok, [[CALL, "done"]]).bind(prompts)
    (t,) = loop(tok, {"calculator": Weird(create_fails=True)}).run(prompts, [RowContext()], engine, budget=2000)
    observation = tok.decode([x for x, m in zip(t.response_ids, t.response_mask) if m == 0])
    assert "RuntimeError: no instance for you" in observation and t.tool_errors == 1 and t.end_reason == "stop"


class Garbage(BaseInteraction):
    def __init__(self, reply):
        super().__init__({"name": "g"})
        self.reply = reply

    async def generate_response(self, instance_id, messages, **kwargs):
        return self.reply


@pytest.mark.parametrize("reply, scores, reason", [
    ((False, "again", "n/a", {}), [], "max_assistant_turns"),  # a score that is no number is dropped
    ((False, "again", float("nan"), {}), [], "max_assistant_turns"),
    ((False, {"text": 1}, 1.0, {}), [], "interaction"),  # non-text reply: ends, counted
    ("not a tuple", [], "interaction"),
])
def test_misbehaving_interactions_never_crash(tok, reply, scores, reason):
    prompts = [ids(tok, "P:", eos=False)]
    engine = Script(tok, [["a", "b", "c"]]).bind(prompts)
    rows = [RowContext(interaction_kwargs={"name": "g"})]
    (t,) = loop(tok, tools={}, interactions={"g": Garbage(reply)}, max_assistant_turns=2).run(
        prompts, rows, engine, budget=500)
    assert t.turn_scores == scores and t.end_reason == reason
    assert t.tool_errors == (1 if reason == "interaction" else 0)


def test_template_that_refuses_tool_turns_is_one_clear_line():
    tok = build_byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
                         "{% endif %}{{ m['role'] + ': ' + m['content'] + '<|im_end|>' }}{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(ValueError, match="cannot render a 'tool' turn after an assistant turn"):
        loop(tok)
    loop(tok, tools={}, interactions={"t": Teacher()})  # user turns are fine
