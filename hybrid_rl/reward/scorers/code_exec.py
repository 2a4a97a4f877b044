"""Scorer for code tasks (``data_source: code_exec``): run the response's code against the row's tests.

The program is the response's *last* fenced code block (```` ```python ```` / ```` ```py ```` / plain
```` ``` ````). Each test runs in its own :func:`~hybrid_rl.reward.sandbox.run_python` process.
``ground_truth`` (a dict, or its JSON text) holds either

* ``{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}`` -- standard-input tests, compared
  line by line with trailing whitespace and trailing blank lines ignored; or
* ``{"asserts": ["assert f(2) == 4", ...]}`` -- each statement runs after the program in one file
  (an ``AssertionError`` is a wrong answer).

Scoring is **all or nothing** by default (1.0 when every test passes; tests stop at the first failure,
so an infinite loop costs one timeout, not one per test). ``partial_credit=True`` runs every test and
scores the fraction passed. A row that fails names one reason -- its first failing test's: a sandbox
reason (:data:`~hybrid_rl.reward.sandbox.FAILURE_REASONS`), ``wrong_answer``, or ``no_code`` (no code
block) -- returned as ``reason`` and as the counters ``reward/sandbox/<reason>`` (1 for the row's
reason, 0 for the others), which the reward manager sums into the step's metrics.

Time: the tests of one row share ``max_total_s`` (default 8 s, under the reward manager's default
``timeout_s`` of 10 s per row); a test that cannot start within it fails with ``timeout``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any, NamedTuple, Optional

from hybrid_rl.reward.sandbox import FAILURE_REASONS, SandboxConfig, run_python

__all__ = ["ROW_REASONS", "compute_score", "extract_code", "parse_tests"]

ROW_REASONS = (*FAILURE_REASONS, "wrong_answer", "no_code")
"""Every reason a row can fail with; each has a ``reward/sandbox/<reason>`` counter."""

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
# CPU time bounds a busy program; the wall clock (sleepers) is looser, as starting Python alone can take a
# second on a loaded machine
_DEFAULT_TEST_LIMITS = {"timeout_s": 5.0, "cpu_s": 2.0}


class _Test(NamedTuple):
    stdin: str
    expected: Optional[str]  # None: an assert test (the exit status decides)
    suffix: str  # appended to the program (an assert statement), or ""


def extract_code(solution_str: str) -> Optional[str]:
    """The last fenced code block of ``solution_str``, or None when there is none."""
    if not isinstance(solution_str, str):
        return None
    blocks = _FENCE_RE.findall(solution_str)
    return blocks[-1] if blocks and blocks[-1].strip() else None


def parse_tests(ground_truth: Any) -> list[_Test]:
    """The row's tests; ValueError naming the fix when ``ground_truth`` has neither form."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise ValueError(f"code_exec ground_truth is not JSON ({exc}); store "
                             '{"inputs": [...], "outputs": [...]} or {"asserts": [...]}') from None
    if isinstance(ground_truth, dict) and "asserts" in ground_truth:
        asserts = ground_truth["asserts"]
        if isinstance(asserts, list) and asserts and all(isinstance(a, str) for a in asserts):
            return [_Test("", None, a) for a in asserts]
    if isinstance(ground_truth, dict) and "inputs" in ground_truth and "outputs" in ground_truth:
        inputs, outputs = ground_truth["inputs"], ground_truth["outputs"]
        if (isinstance(inputs, list) and isinstance(outputs, list) and inputs and len(inputs) == len(outputs)
                and all(isinstance(v, str) for v in inputs + outputs)):
            return [_Test(i, o, "") for i, o in zip(inputs, outputs)]
    raise ValueError(f"code_exec ground_truth {str(ground_truth)[:120]!r} has no tests; give "
                     '{"inputs": [stdin strings], "outputs": [stdout strings]} of equal non-zero length, or '
                     '{"asserts": [statement strings]}')


def _same_output(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(expected)


def _run_test(code: str, test: _Test, config: SandboxConfig) -> str:
    """``ok`` or the test's failure reason."""
    source = code if not test.suffix else f"{code}\n\n{test.suffix}\n"
    result = run_python(source, stdin=test.stdin, config=config)
    if result.reason == "error" and test.expected is None and "AssertionError" in result.stderr[-2000:]:
        return "wrong_answer"
    if result.reason != "ok":
        return result.reason
    return "ok" if test.expected is None or _same_output(result.stdout, test.expected) else "wrong_answer"


def _verdict(score: float, passed: int, num_tests: int, reason: str) -> dict[str, Any]:
    counters = {f"reward/sandbox/{r}": int(r == reason) for r in ROW_REASONS}
    return {"score": score, "acc": passed == num_tests, "tests_passed": passed, "num_tests": num_tests,
            "reason": reason, **counters}


def compute_score(solution_str: str, ground_truth: Any, partial_credit: bool = False,
                  sandbox: SandboxConfig | dict | None = None, max_total_s: float = 8.0) -> dict[str, Any]:
    """``{"score", "acc", "tests_passed", "num_tests", "reason", "reward/sandbox/<reason>"...}``.

    Args:
        solution_str: the model's response.
        ground_truth: the tests (see the module docstring).
        partial_credit: score the fraction of tests passed instead of all or nothing.
        sandbox: limits of each test's run (:class:`~hybrid_rl.reward.sandbox.SandboxConfig` fields);
            default: 2 s of CPU, 5 s wall clock, 512 MiB.
        max_total_s: wall-clock budget of all the row's tests together.
    """
    tests = parse_tests(ground_truth)
    code = extract_code(solution_str)
    if code is None:
        return _verdict(0.0, 0, len(tests), "no_code")
    base = SandboxConfig.of(sandbox if sandbox is not None else _DEFAULT_TEST_LIMITS)
    deadline = time.monotonic() + float(max_total_s)
    passed, first_failure = 0, None
    for test in tests:
        left = deadline - time.monotonic()
        if left <= 0.05:
            outcome = "timeout"
        else:
            limits = dataclasses.replace(base, timeout_s=min(base.timeout_s, left))
            outcome = _run_test(code, test, limits)
        passed += outcome == "ok"
        first_failure = first_failure or (None if outcome == "ok" else outcome)
        if first_failure and not partial_credit:
            break
    score = passed / len(tests) if partial_credit else float(passed == len(tests))
    return _verdict(score, passed, len(tests), first_failure or "ok")
