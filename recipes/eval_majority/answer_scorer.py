"""A scorer that also returns its extracted answer, so validation and ``hybrid_rl.eval`` report
majority voting (``maj@k``: self-consistency) beside ``mean@n`` and ``best@k``.

The arithmetic task's rule (the last ``#### <integer>``, :mod:`hybrid_rl.reward.scorers.arithmetic`),
returned as veRL's dict: ``score``, ``acc`` (the headline variable when present) and ``pred``, the
answer the samples vote with ("" when a response gives none: no answer is a vote too, as in veRL).
"""

from __future__ import annotations

from hybrid_rl.reward.scorers.arithmetic import compute_score as arithmetic_score
from hybrid_rl.reward.scorers.arithmetic import extract_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    """``{"score": 1.0 or 0.0, "acc": bool, "pred": "<answer>" or ""}``."""
    answer = extract_answer(solution_str) if isinstance(solution_str, str) else None
    score = arithmetic_score(solution_str, ground_truth)
    return {"score": score, "acc": score > 0, "pred": "" if answer is None else str(answer)}
