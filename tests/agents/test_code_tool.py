"""The ``python_exec`` tool: loads from a tool YAML by name, runs code in the sandbox, shows its output."""

import asyncio
import sys

import pytest

from hybrid_rl.agents import PythonExecTool, load_tools
from hybrid_rl.reward.sandbox import FAILURE_REASONS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's limits are Linux's")

# the CPU limit stops busy code; the wall clock is loose for a loaded shared machine
LIMITS = {"timeout_s": 15, "cpu_s": 1, "memory_mb": 256}


def _call(tool, **parameters):
    return asyncio.run(tool.execute("row-0", parameters))


def test_loads_by_name_and_prints_output(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: python_exec\n    config: {type: native, timeout_s: 15, cpu_s: 1}\n")
    tool = load_tools(str(path))["python_exec"]
    text, reward, metrics = _call(tool, code="print(sum(range(int(input()))))", stdin="11\n")
    assert (text, reward) == ("55\n", 0.0)
    assert metrics == {f"sandbox/{r}": 0.0 for r in FAILURE_REASONS}


def test_errors_show_the_traceback_end_and_the_reason():
    tool = PythonExecTool(config=LIMITS)
    text, _, metrics = _call(tool, code="print('before')\n1 / 0")
    lines = text.splitlines()
    assert lines[0] == "before" and lines[1] == "stderr:"
    assert lines[-2:] == ["ZeroDivisionError: division by zero", "[exit: error]"]
    assert "_sandbox_child" not in text  # only the program's own frames
    assert metrics["sandbox/error"] == 1.0 and sum(metrics.values()) == 1.0


def test_limits_reach_the_model_as_reasons(tmp_path):
    tool = PythonExecTool(config=LIMITS)
    loop, _, loop_metrics = _call(tool, code="while True:\n    pass")
    assert loop.endswith("[exit: timeout]") and loop_metrics["sandbox/timeout"] == 1.0
    escape, _, escape_metrics = _call(tool, code=f"open({str(tmp_path / 'x')!r}, 'w')")
    assert escape.endswith("[exit: forbidden_write]") and escape_metrics["sandbox/forbidden_write"] == 1.0
    assert not (tmp_path / "x").exists()


def test_long_output_is_cut_and_nothing_persists_between_calls():
    tool = PythonExecTool(config={**LIMITS, "max_output_chars": 50})
    text, _, _ = _call(tool, code="print('a' * 500)")
    assert text == "a" * 50 + "... [451 chars cut]"
    _call(tool, code="x = 1")
    assert "NameError" in _call(tool, code="print(x)")[0]


@pytest.mark.parametrize("parameters, fragment", [
    ({}, "'code' must be a non-empty string"),
    ({"code": "  "}, "'code' must be a non-empty string"),
    ({"code": "print(1)", "stdin": 3}, "'stdin' a string"),
])
def test_bad_calls_answer_in_one_line(parameters, fragment):
    text, _, metrics = _call(PythonExecTool(config=LIMITS), **parameters)
    assert fragment in text and metrics == {"sandbox/error": 1.0}


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="max_output_chars=0 must be >= 1"):
        PythonExecTool(config={"max_output_chars": 0})
    with pytest.raises(ValueError, match=r"unknown sandbox config key\(s\) \['timeout'\]"):
        PythonExecTool(config={"timeout": 3})
