"""Rule-based scorers, one task per module.

Each module exposes a veRL-style ``compute_score(solution_str, ground_truth, ...)`` returning a float.
They are pure functions of strings: untrusted model output that cannot be parsed scores 0.0, it never
raises. Dispatch by ``data_source`` lives in :mod:`hybrid_rl.reward.registry`.
"""

from hybrid_rl.reward.scorers import arithmetic, gsm8k, math

__all__ = ["arithmetic", "gsm8k", "math"]
