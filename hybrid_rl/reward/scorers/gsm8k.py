"""GSM8K scorer with veRL's semantics (``verl.utils.reward_score.gsm8k``).

``strict``: the last ``#### <number>`` in the final 300 characters of the response, commas and ``$``
stripped, must equal the ground truth string exactly (after the same normalisation) -> ``score``;
a well-formatted wrong answer -> ``format_score``; no ``#### <number>`` -> 0.0.
``flexible``: the last number anywhere in the final 300 characters.

Deviation from veRL: ``#### $1,234`` (a dollar sign before the number) is accepted in strict mode,
and ground truths are normalised like answers (veRL compares them raw). Clipping to the last 300
characters keeps the regex cost bounded on huge outputs, as in veRL.
"""

from __future__ import annotations

import re

SOLUTION_CLIP_CHARS = 300
_STRICT_RE = re.compile(r"#### \$?(-?[0-9.,]+)")
_FLEXIBLE_RE = re.compile(r"(-?[0-9.,]+)")
_METHODS = ("strict", "flexible")


def normalize_number(text: str) -> str:
    """Strip commas, ``$`` and surrounding whitespace: ``" $1,234 "`` -> ``"1234"``."""
    return text.replace(",", "").replace("$", "").strip()


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The normalised final answer of ``solution_str`` or ``None`` if there is none."""
    if method not in _METHODS:
        raise ValueError(f"gsm8k method must be one of {_METHODS}, got {method!r}")
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT_RE.findall(tail)
        return normalize_number(matches[-1]) if matches else None
    # flexible: the last match that is more than punctuation ("." or "," alone is not a number)
    for candidate in reversed(_FLEXIBLE_RE.findall(tail)):
        answer = normalize_number(candidate)
        if answer not in ("", ".", "-", "-."):
            return answer
    return None


def compute_score(
    solution_str: str,
    ground_truth: str | int | float,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth`` (as normalised strings), else
    ``format_score`` when an answer was found, else 0.0."""
    if not isinstance(solution_str, str):
        return 0.0
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == normalize_number(str(ground_truth)) else float(format_score)
