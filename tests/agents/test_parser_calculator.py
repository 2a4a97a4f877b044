"""Tool-call parsing (hermes), the calculator's arithmetic, and the tool/interaction registries."""

import asyncio

import pytest

from hybrid_rl.agents import BaseTool, CalculatorTool, parse_hermes, register_tool
from hybrid_rl.agents.calculator import evaluate
from hybrid_rl.agents.parser import get_tool_parser
from hybrid_rl.agents.schemas import as_tool_schema
from hybrid_rl.agents.tool import get_tool_cls


def test_hermes_parses_calls_in_order():
    text = ('first <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call> then '
            '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n</tool_call>')
    calls = parse_hermes(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "2*3"}, None), ("search", {"q": "x"}, None)]


@pytest.mark.parametrize("body, fragment", [
    ('{"name": "calculator", "arguments": {"expression": "2*3"}', "not valid JSON"),
    ('["calculator"]', '"name" string'),
    ('{"name": "calculator", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
])
def test_hermes_malformed_call_is_an_error_not_dropped(body, fragment):
    (call,) = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and fragment in call.error


def test_no_call_and_unclosed_block():
    assert parse_hermes("the answer is 42") == []
    assert parse_hermes('<tool_call>{"name": "calculator"}') == []


def test_unknown_format_names_the_key():
    with pytest.raises(ValueError, match="rollout.multi_turn.format='json'.*hermes"):
        get_tool_parser("json")


@pytest.mark.parametrize("expression, value", [
    ("317 * 46", "14582"), ("(2+3)*4 - 1", "19"), ("7 / 2", "3.5"), ("7 // 2", "3"), ("-3 ** 2", "-9"),
    ("2 ^ 10", "1024"), ("1,234 + 1", "1235"), ("10 % 4", "2"), ("6 / 3", "2"),
])
def test_calculator_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, fragment", [
    ("", "empty"), ("__import__('os')", "unsupported"), ("1/0", "division by zero"), ("9**9**9", "exponents"),
    ("2 +", "does not parse"), ("x" * 300, "longer than"), ("10**60 * 10**60 * 10**60 * 10**60", "too large"),
])
def test_calculator_refuses_what_is_not_arithmetic(expression, fragment):
    with pytest.raises(ValueError, match=fragment):
        evaluate(expression)


def test_calculator_instance_tracks_correct_use():
    tool = CalculatorTool()
    assert tool.name == "calculator"

    async def session():
        iid, _ = await tool.create(ground_truth=14582)
        wrong = await tool.execute(iid, {"expression": "317 * 45"})
        bad = await tool.execute(iid, {"expression": "317 x"})
        before = await tool.calc_reward(iid)
        right = await tool.execute(iid, {"expression": "317*46"})
        after = await tool.calc_reward(iid)
        await tool.release(iid)
        return wrong, bad, before, right, after

    wrong, bad, before, right, after = asyncio.run(session())
    assert wrong == ("14265", 0.0, {"error": 0.0, "correct": 0.0})
    assert bad[0].startswith("Error:") and bad[2] == {"error": 1.0}
    assert (before, right[2]["correct"], after) == (0.0, 1.0, 1.0)


def test_register_tool_rejects_duplicates_and_non_tools():
    @register_tool("test_echo_tool")
    class Echo(BaseTool):
        pass

    assert get_tool_cls("test_echo_tool", "here") is Echo
    with pytest.raises(ValueError, match="already registered"):
        @register_tool("test_echo_tool")
        class Other(BaseTool):
            pass
    with pytest.raises(ValueError, match="neither a BaseTool subclass"):
        register_tool("nope")(int)
    with pytest.raises(ValueError, match="unknown tool class 'nosuch'"):
        get_tool_cls("nosuch", "here")
    with pytest.raises(ValueError, match="cannot import tool class"):
        get_tool_cls("no_such_pkg.Tool", "here")


def test_schema_check_names_the_problem():
    with pytest.raises(ValueError, match="type 'function'"):
        as_tool_schema({"function": {"name": "x"}}, "t")
    with pytest.raises(ValueError, match="no function.name"):
        as_tool_schema({"type": "function", "function": {}}, "t")
    with pytest.raises(ValueError, match="parameters of tool 'x'"):
        as_tool_schema({"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}, "t")
    with pytest.raises(ValueError, match="no default schema"):
        BaseTool()


def test_calculator_refuses_towers_of_powers_before_computing():
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match="too large"):
        evaluate("((((9**64)**64)**64)**64)**64")
    assert time.perf_counter() - start < 30  # generous for a loaded machine; computing it would take for ever
    assert evaluate("(2**10)**3") == str(2**30)


def test_llama3_json_format():
    parse = get_tool_parser("llama3_json")
    calls = parse('<|python_tag|>{"name": "calculator", "parameters": {"expression": "2*3"}}; '
                  '{"name": "calculator", "arguments": {"expression": "1+1"}}<|eom_id|>')
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "2*3"}, None), ("calculator", {"expression": "1+1"}, None)]
    assert parse("The answer is 6.") == []
    (bad,) = parse('{"name": "calculator", "parameters": ')
    assert "not valid JSON" in bad.error


def test_mistral_format_both_layouts_and_the_prose_before_the_calls():
    from hybrid_rl.agents.parser import text_before_calls

    parse = get_tool_parser("mistral")
    v3 = ('[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "6 * 7"}}, '
          '{"name": "search", "arguments": "{\\"q\\": \\"x\\"}", "id": "a1b2c3d4e"}]</s>')
    assert [(c.name, c.arguments, c.error) for c in parse(v3)] == [
        ("calculator", {"expression": "6 * 7"}, None), ("search", {"q": "x"}, None)]
    v11 = ('Let me compute.[TOOL_CALLS]calculator[ARGS]{"expression": "6 * 7"}'
           '[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"q": "x"}</s>')
    assert [(c.name, c.arguments, c.error) for c in parse(v11)] == [
        ("calculator", {"expression": "6 * 7"}, None), ("search", {"q": "x"}, None)]
    assert parse("The answer is 42.</s>") == []
    (cut,) = parse('[TOOL_CALLS]calculator[ARGS]{"expression": ')
    assert cut.name == "calculator" and "arguments are not valid JSON" in cut.error
    (bad,) = parse("[TOOL_CALLS] calculator(6 * 7)")
    assert "not valid JSON" in bad.error
    (listed,) = parse('[TOOL_CALLS][{"name": "search", "arguments": {"q": "a [ARGS] b"}}]')
    assert (listed.name, listed.arguments, listed.error) == ("search", {"q": "a [ARGS] b"}, None)
    (bare,) = parse('[TOOL_CALLS]search{"q": "x"}</s>')  # v11 without [ARGS], as vLLM reads it
    assert (bare.name, bare.arguments, bare.error) == ("search", {"q": "x"}, None)
    (unnamed,) = parse("[TOOL_CALLS][ARGS]{}")
    assert "no function name" in unnamed.error
    (nameless,) = parse('[TOOL_CALLS] [{"arguments": {}}]')
    assert '"name" string' in nameless.error
    assert text_before_calls("mistral", v11) == "Let me compute."
    assert text_before_calls("hermes", 'Sure. <tool_call>{"name": "f"}</tool_call>') == "Sure."
    assert text_before_calls("llama3_json", '{"name": "f", "parameters": {}}') == ""
