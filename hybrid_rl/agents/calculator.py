"""The built-in ``calculator`` tool: exact arithmetic on an expression string.

The expression is parsed with :mod:`ast` and evaluated over a whitelist (numbers, ``+ - * / // % **``,
parentheses, unary minus); nothing is ``eval``-ed. Integers stay exact; ``**`` is bounded so a model
cannot ask for ``9**9**9``. Results print as integers when integral (``14582``, not ``14582.0``).

When the row's ``tools_kwargs.calculator.create_kwargs`` carries ``ground_truth``, each call reports the
metric ``correct`` (1.0 when its result equals the ground truth) and ``calc_reward`` is 1.0 when some call
of the trajectory was correct: "the model used the tool correctly".
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from typing import Any, Optional

from hybrid_rl.agents.tool import BaseTool, ToolResponse, register_tool

__all__ = ["CALCULATOR_SCHEMA", "CalculatorTool", "evaluate"]

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly (+, -, *, /, //, %, **, parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. '317 * 46'"}},
            "required": ["expression"],
        },
    },
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_EXPRESSION_CHARS = 200
_MAX_ABS_EXPONENT = 64
_MAX_DIGITS = 200


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > _MAX_ABS_EXPONENT:
                raise ValueError(f"exponents must be integers up to {_MAX_ABS_EXPONENT}")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
            # bound the result's size before computing it: (9**64)**64... would hold the GIL for hours
            bits = max(left.numerator.bit_length(), left.denominator.bit_length()) * abs(int(right))
            if bits > _MAX_DIGITS * 4:
                raise ValueError("the result is too large")
            return left ** int(right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        if isinstance(node.op, ast.FloorDiv):
            return Fraction(left // right)
        return Fraction(_BINARY[type(node.op)](left, right))
    raise ValueError(f"unsupported syntax {type(node).__name__}: use numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> str:
    """The exact value of ``expression`` as text; ValueError with a short reason when it is not arithmetic."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("the expression is empty")
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    text = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("the expression does not parse") from None
    value = _eval(tree)
    if len(str(value.numerator)) > _MAX_DIGITS:
        raise ValueError("the result is too large")
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


def _as_number(value: Any) -> Optional[Fraction]:
    try:
        return Fraction(str(value).replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


@register_tool("calculator")
class CalculatorTool(BaseTool):
    """``calculator(expression)`` -> the exact value; see the module docstring for the metrics."""

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return CALCULATOR_SCHEMA

    async def create(self, instance_id: Optional[str] = None, ground_truth: Any = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        self._instances[instance_id] = {"target": _as_number(ground_truth) if ground_truth is not None else None,
                                        "correct": False}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        state = self._instances.setdefault(instance_id, {"target": None, "correct": False})
        try:
            result = evaluate(parameters.get("expression"))
        except ValueError as exc:
            return f"Error: {exc}", 0.0, {"error": 1.0}
        metrics = {"error": 0.0}
        if state["target"] is not None:
            correct = _as_number(result) == state["target"]
            state["correct"] = state["correct"] or correct
            metrics["correct"] = float(correct)
        return result, 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return float(self._instances.get(instance_id, {}).get("correct", False))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
