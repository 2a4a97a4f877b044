"""MATH-style scorer: the last ``\\boxed{...}`` of the response, checked with math-verify.

The boxed content is found by a linear brace scan (balanced braces, nesting allowed), so huge or
adversarial strings cost O(n) and unbalanced braces simply mean "no answer" (0.0). The content is
compared with the ground truth first as a string (fast path) and then symbolically with
``math_verify.parse``/``verify``.

math-verify bounds its own work with ``signal.alarm``, which only works in the main thread of the
main interpreter; elsewhere it raises. Off the main thread we therefore pass ``parsing_timeout=None``
and ``timeout_seconds=None`` and rely on the caller's guard (:mod:`hybrid_rl.reward.guard`) for the
time bound. Any exception inside math-verify scores 0.0.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_ANSWER_CHARS = 1000


def _braced_content(text: str, open_idx: int) -> str | None:
    """Content of the brace group opening at ``text[open_idx] == "{"``, or None if unbalanced."""
    depth = 0
    for i in range(open_idx, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
    return None


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None.

    ``"a \\boxed{\\frac{1}{2}} b"`` -> ``"\\frac{1}{2}"``. A last box that never closes yields None
    rather than an earlier box: the model's final answer is malformed.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    brace = start + len(cmd)
    while brace < len(text) and text[brace] == " ":
        brace += 1
    if brace >= len(text) or text[brace] != "{":
        return None
    return _braced_content(text, brace)


_warmed_up = False


class _DropDisabledTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; here that is deliberate (the guard bounds time)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


def warmup() -> None:
    """Import math-verify and build its LaTeX grammar now (~1.3 s, once per process).

    The reward guard scores in a forked child by default; anything lazily initialised inside the
    child is lost when it exits, so the manager calls this in the parent before forking.
    """
    global _warmed_up
    if not _warmed_up:
        _math_verify_equal("1", "2", timeout_s=5)
        _warmed_up = True


def _math_verify_equal(gold_latex: str, answer_latex: str, timeout_s: int) -> bool:
    from math_verify import parse, verify

    # signal.alarm-based timeouts only work in the main thread; elsewhere the guard bounds time.
    in_main = threading.current_thread() is threading.main_thread()
    limit = timeout_s if in_main and timeout_s > 0 else None
    gold = parse(f"\\boxed{{{gold_latex}}}", parsing_timeout=limit)
    answer = parse(f"\\boxed{{{answer_latex}}}", parsing_timeout=limit)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=limit))


def _strip_ground_truth(ground_truth) -> str:
    text = str(ground_truth).strip()
    boxed = last_boxed_content(text) if "\\boxed" in text or "\\fbox" in text else None
    if boxed is not None:
        return boxed.strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$").strip()
    return text


def compute_score(
    solution_str: str,
    ground_truth: str,
    format_score: float = 0.0,
    score: float = 1.0,
    timeout_s: int = 5,
) -> float:
    """``score`` if the last boxed answer equals ``ground_truth`` (string or math-verify), else
    ``format_score`` when a boxed answer exists, else 0.0.

    ``timeout_s`` bounds each math-verify step when running in the main thread (integer seconds).
    """
    if not isinstance(solution_str, str):
        return 0.0
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    answer = answer.strip()
    gold = _strip_ground_truth(ground_truth)
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return float(format_score)
    if answer == gold:
        return float(score)
    from math_verify.errors import TimeoutException  # a BaseException, not an Exception

    try:
        equal = _math_verify_equal(gold, answer, int(timeout_s))
    except (Exception, TimeoutException) as exc:  # untrusted text: any failure is "not equal"
        logger.debug("math-verify failed on %.200r: %s", answer, exc)
        equal = False
    return float(score) if equal else float(format_score)
