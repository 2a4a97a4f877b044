"""Scorer for hybrid_rl's synthetic ``arithmetic`` task (see :mod:`hybrid_rl.data`).

The prompt asks for the final answer after ``####``. The response scores ``score`` (1.0) when the
*last* ``#### <integer>`` equals the integer ground truth, ``format_score`` (0.0) when it is a
well-formed but wrong integer, and 0.0 when there is none or it is not an integer (``#### 3.5``).
Accepted forms: ``#### 42``, ``####-42``, ``#### - 42``, ``#### 1,234``. Only ASCII digits count:
``int()`` would accept other scripts' digits, which the task never asks for.
"""

from __future__ import annotations

import re

# No two adjacent unbounded quantifiers can match the same characters, so the scan is linear even on
# adversarial inputs (e.g. a megabyte of spaces after "####").
_MAX_DIGITS = 4000
_ANSWER_RE = re.compile(r"####[ \t]*(-[ \t]*)?([0-9][0-9,]*)(\.[0-9]+)?")


def extract_answer(solution_str: str) -> int | None:
    """The integer after the last ``####`` that is followed by a number, or ``None``."""
    last = None
    for last in _ANSWER_RE.finditer(solution_str):
        pass
    if last is None:
        return None
    sign, digits, fraction = last.groups()
    if fraction is not None and fraction.strip(".0"):
        return None  # "#### 3.5" is not an integer answer; "#### 3.0" is 3
    digits = digits.replace(",", "")
    if not digits or len(digits) > _MAX_DIGITS:
        return None  # int() refuses > 4300 digits; no task answer is that long
    return -int(digits) if sign else int(digits)


def _ground_truth_int(ground_truth) -> int | None:
    try:
        text = str(ground_truth).replace(",", "").replace(" ", "").strip()
        value = float(text) if "." in text else int(text)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(value) if float(value).is_integer() else None


def compute_score(
    solution_str: str, ground_truth: int | str, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` if the last ``#### <integer>`` equals ``ground_truth`` else ``format_score``/0.0."""
    if not isinstance(solution_str, str):
        return 0.0
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    target = _ground_truth_int(ground_truth)
    return float(score) if target is not None and answer == target else float(format_score)
