"""The built-in ``python_exec`` tool: run the model's Python in the sandbox, show it what came out.

Each call runs ``code`` (with optional ``stdin``) as a fresh program in
:func:`hybrid_rl.reward.sandbox.run_python` -- its own temporary folder, CPU/memory/file/process limits,
a wall clock, no inherited secrets (docs/sandbox.md) -- on a worker thread, so other trajectories' calls
run meanwhile. Nothing persists between calls: a variable defined in one call is gone in the next.

The observation is the program's stdout, then its stderr under ``stderr:``, each cut to
``max_output_chars`` (the end is kept for stderr, where a traceback's last line is), and a last line
``[exit: <reason>]`` when the run failed (``timeout``, ``memory``, ``file_size``, ``processes``,
``forbidden_write``, ``error``). Metrics per call: ``sandbox/<reason>`` = 1.0 for the run's reason, 0.0
for the others (the rollout reports their maximum per trajectory as ``tool/python_exec/sandbox/...``).

Tool YAML::

    tools:
      - class_name: python_exec
        config: {timeout_s: 5, memory_mb: 512, max_output_chars: 2000}
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from hybrid_rl.agents.tool import BaseTool, register_tool
from hybrid_rl.reward.sandbox import FAILURE_REASONS, SandboxConfig, run_python

__all__ = ["PYTHON_EXEC_SCHEMA", "PythonExecTool"]

PYTHON_EXEC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python_exec",
        "description": "Run a Python 3 program (standard library only) and return what it prints. "
                       "Each call starts fresh; print the values you need.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program, e.g. 'print(2**10)'"},
                           "stdin": {"type": "string", "description": "its standard input (optional)"}},
            "required": ["code"],
        },
    },
}

_MAX_CODE_CHARS = 100_000


def _cut(text: str, limit: int, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    note = f"... [{len(text) - limit} chars cut]"
    return note + text[-limit:] if keep_end else text[:limit] + note


def _on_new_line(text: str, more: str) -> str:
    return text + ("\n" if text and not text.endswith("\n") else "") + more


@register_tool("python_exec")
class PythonExecTool(BaseTool):
    """``python_exec(code, stdin="")`` -> the program's output; ``config``: the
    :class:`~hybrid_rl.reward.sandbox.SandboxConfig` fields plus ``max_output_chars`` (default 2000)."""

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        super().__init__(config, tool_schema)
        settings = {k: v for k, v in self.config.items() if k != "type"}  # type: native, read by load_tools
        self.max_output_chars = int(settings.pop("max_output_chars", 2000))
        if self.max_output_chars < 1:
            raise ValueError(f"python_exec config max_output_chars={self.max_output_chars} must be >= 1; "
                             "set it to the characters of output shown to the model, e.g. 2000")
        self.sandbox = SandboxConfig.of(settings)

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return PYTHON_EXEC_SCHEMA

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        code, stdin = parameters.get("code"), parameters.get("stdin") or ""
        if not isinstance(code, str) or not code.strip():
            return "Error: 'code' must be a non-empty string of Python source", 0.0, {"sandbox/error": 1.0}
        if len(code) > _MAX_CODE_CHARS or not isinstance(stdin, str):
            return (f"Error: 'code' must be at most {_MAX_CODE_CHARS} characters and 'stdin' a string", 0.0,
                    {"sandbox/error": 1.0})
        result = await asyncio.to_thread(run_python, code, stdin, self.sandbox)
        text = _cut(result.stdout, self.max_output_chars)
        if result.stderr:
            text = _on_new_line(text, "stderr:\n" + _cut(result.stderr, self.max_output_chars, keep_end=True))
        if not result.ok:
            text = _on_new_line(text, f"[exit: {result.reason}]")
        return text or "(no output)", 0.0, {f"sandbox/{r}": float(r == result.reason) for r in FAILURE_REASONS}
