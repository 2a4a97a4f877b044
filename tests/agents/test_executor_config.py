"""Bounded concurrent tool calls, and the tool / interaction YAML loaders."""

import asyncio
import threading
import time

import pytest

from hybrid_rl.agents import MultiTurnConfig, load_interactions, load_tools
from hybrid_rl.agents.executor import AsyncRunner


async def _value(x, delay=0.0):
    await asyncio.sleep(delay)
    return x


async def _raise():
    raise RuntimeError("boom")


def _sync_raise():
    raise TypeError("wrong signature")  # raised when the call is made, before any coroutine exists


async def _cancel():
    raise asyncio.CancelledError()


async def _block_loop(released: threading.Event):
    released.wait(60)  # synchronous: cannot be cancelled
    return "late"


async def _together(x, arrived: list, n: int):
    """``x`` once ``n`` calls have arrived: run one after another, the first would wait for ever."""
    arrived.append(x)
    while len(arrived) < n:
        await asyncio.sleep(0.01)
    return x


def test_runner_runs_concurrently_and_keeps_order():
    runner, arrived = AsyncRunner(), []
    out = runner.run([lambda: _together(1, arrived, 3), lambda: _together(2, arrived, 3),
                      lambda: _together(3, arrived, 3)], timeout_s=30)
    assert out == [("ok", 1), ("ok", 2), ("ok", 3)]  # in a row, call 1 would have timed out


def test_runner_turns_errors_and_hangs_into_results():
    runner = AsyncRunner()
    # one timeout for the run: long enough for _value("ok") on a slow, loaded machine, short for the test
    out = runner.run([_raise, lambda: _value("slow", 3600), lambda: _value("ok"), _sync_raise, _cancel], timeout_s=3)
    assert out[0] == ("error", "RuntimeError: boom")
    assert out[1][0] == "timeout" and out[2] == ("ok", "ok")
    assert out[3] == ("error", "TypeError: wrong signature") and out[4][0] == "error"
    assert runner.run([lambda: _value(5)], timeout_s=30) == [("ok", 5)]  # the loop is still healthy
    assert runner.run([lambda: _value(6, 1.3)], timeout_s=0) == [("ok", 6)]  # 0 = no time bound


def test_runner_abandons_a_blocked_loop():
    runner, released = AsyncRunner(), threading.Event()
    start = time.perf_counter()
    try:
        out = runner.run([lambda: _block_loop(released), lambda: _value(1)], timeout_s=0.2)
        waited = time.perf_counter() - start
        assert runner.run([lambda: _value(7)], timeout_s=30) == [("ok", 7)]  # a fresh loop, the old one still blocked
    finally:
        released.set()  # let the abandoned loop go
    assert waited < 30  # not held until the blocking call returns (60 s)
    assert out[0][0] == "timeout" and runner.num_abandoned_loops == 1


TOOLS_YAML = """
tools:
  - class_name: calculator
    config: {type: native}
  - class_name: hybrid_rl.agents.calculator.CalculatorTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc2
        description: same tool, second name
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
"""


def test_load_tools_by_name_and_dotted_path(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    tools = load_tools(str(path))
    assert sorted(tools) == ["calc2", "calculator"]
    assert tools["calc2"].tool_schema.function.description == "same tool, second name"


@pytest.mark.parametrize("text, fragment", [
    ("tools: [", "not valid YAML at line"),
    ("tools: {a: 1}", "'tools:' list"),
    ("tools:\n  - config: {}", "has no class_name"),
    ("tools:\n  - class_name: nosuch_tool", "unknown tool class 'nosuch_tool'"),
    ("tools:\n  - class_name: calculator\n    config: {type: mcp}", "type='mcp' is not supported"),
    ("tools:\n  - class_name: calculator\n  - class_name: calculator", "second tool named 'calculator'"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {type: function, function: {}}", "no function.name"),
])
def test_bad_tool_yaml_is_one_clear_line(tmp_path, text, fragment):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="tool_config_path") as info:
        load_tools(str(path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_missing_tool_file():
    with pytest.raises(ValueError, match="tool_config_path='/nope.yaml': no such file"):
        load_tools("/nope.yaml")


def test_load_interactions_derives_names(tmp_path):
    path = tmp_path / "inter.yaml"
    path.write_text("interaction:\n  - class_name: hybrid_rl.agents.interaction.BaseInteraction\n"
                    "  - name: judge\n    class_name: hybrid_rl.agents.interaction.BaseInteraction\n    config: {k: 1}\n")
    inter = load_interactions(str(path))
    assert sorted(inter) == ["base", "judge"] and inter["judge"].config == {"k": 1, "name": "judge"}


def test_multi_turn_config_checks():
    with pytest.raises(ValueError, match="multi_turn.max_assistant_turns=0"):
        MultiTurnConfig(enable=True, max_assistant_turns=0)
    with pytest.raises(ValueError, match="tool_response_truncate_side='top'"):
        MultiTurnConfig(tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="set rollout.multi_turn.enable=true"):
        MultiTurnConfig(tool_config_path="t.yaml")


def test_plugins_registered_here_reach_another_process_by_value():
    """A tool defined in a notebook cell (here: inside a function) is pickled by value with the
    snapshot the trainer sends to its workers, and registered there again."""
    import cloudpickle

    from hybrid_rl.agents import BaseTool, register_tool
    from hybrid_rl.agents import tool as tool_module
    from hybrid_rl.agents.plugins import plugin_snapshot, restore_plugins
    from hybrid_rl.agents.tool import get_tool_cls

    @register_tool("test_notebook_tool")
    class NotebookTool(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return "from the notebook", 0.0, {}

    payload = cloudpickle.dumps(plugin_snapshot())
    tool_module._TOOLS.unregister("test_notebook_tool")  # as in a fresh worker process
    restore_plugins(cloudpickle.loads(payload))
    cls = get_tool_cls("test_notebook_tool", "here")
    assert cls.__name__ == "NotebookTool" and get_tool_cls("calculator", "here").__name__ == "CalculatorTool"
    tool_module._TOOLS.unregister("test_notebook_tool")
