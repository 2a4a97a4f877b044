"""The reward guard: scorers run on untrusted model output and must never break training.

Every call ends in a :class:`ScoreOutcome` with one of four statuses:

* ``ok`` -- the scorer returned a finite number (or ``{"score": number, ...extra}``),
* ``error`` -- it raised (any exception, including ``SystemExit``) or its process died,
* ``invalid`` -- it returned NaN/inf/None/a string/a dict without a numeric ``"score"``,
* ``timeout`` -- it ran past ``timeout_s``.

Anything but ``ok`` scores 0.0. The time bound is enforced by :mod:`hybrid_rl.reward._isolation`
(a forked child by default, killed on overrun; or a daemon thread) -- see its docstring for the
trade-off between the two.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, NamedTuple, Sequence

from hybrid_rl.reward._isolation import ISOLATION_MODES, default_isolation, run_bounded

__all__ = [
    "ISOLATION_MODES",
    "STATUSES",
    "ScoreOutcome",
    "default_isolation",
    "normalize_score",
    "safe_score",
    "safe_score_many",
]

STATUSES = ("ok", "error", "timeout", "invalid")
_MAX_EXTRA_STR = 1000


class ScoreOutcome(NamedTuple):
    """One guarded score. ``extra`` holds a dict result's other keys (plain values only)."""

    score: float
    extra: dict
    status: str
    message: str = ""


def _plain(value: Any) -> Any:
    """Extra-info values must pickle and log safely: keep scalars (a 0-d numpy or torch value as its
    Python scalar: ``np.bool_(False)`` -> ``False``), stringify the rest; never raises."""
    try:
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # np.bool_, np.float32, a 0-d tensor
            value = value.item()
        if value is None or isinstance(value, (bool, int, float, complex, str)):
            return value[:_MAX_EXTRA_STR] if isinstance(value, str) else value
        if isinstance(value, numbers.Number):
            return value.item() if hasattr(value, "item") else float(value)
    except Exception:  # noqa: BLE001 -- an odd number (a meta tensor, ...) is kept as its text
        pass
    try:
        return repr(value)[:_MAX_EXTRA_STR]
    except Exception:  # noqa: BLE001 -- a hostile __repr__ must not escape
        return f"<{type(value).__name__}>"


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None: untrusted code may return a string, NaN, 10**400, a
    tensor. Real numbers only (and 0-d arrays of them); ``"1.0"`` is None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # 0-d torch/numpy array
    if not isinstance(value, numbers.Real):
        return None  # strings never count, even "1.0": the scorer has a bug worth surfacing
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return result if math.isfinite(result) else None


def normalize_score(raw: Any) -> ScoreOutcome:
    """Turn a scorer's return value into an outcome (never raises).

    ``1``/``True``/``torch.tensor(1.)`` -> ok 1.0; ``{"score": 0.5, "acc": True}`` -> ok 0.5 with
    extra ``{"acc": True}``; ``nan``/``inf``/``None``/``"1.0"``/``{"acc": 1}`` -> invalid 0.0.
    """
    extra: dict = {}
    value = raw
    if isinstance(raw, dict):
        try:
            extra = {str(k): _plain(v) for k, v in raw.items() if k != "score"}
        except Exception:  # noqa: BLE001 -- a hostile __repr__ must not escape
            extra = {}
        if "score" not in raw:
            return ScoreOutcome(0.0, extra, "invalid", "dict result has no 'score' key")
        value = raw["score"]
    score = finite_float(value)
    if score is None:
        try:
            shown = repr(value)[:200]
        except Exception:  # noqa: BLE001
            shown = f"<{type(value).__name__}>"
        return ScoreOutcome(0.0, extra, "invalid", f"score is not a finite number: {shown}")
    return ScoreOutcome(score, extra, "ok")


def _scored(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[[], ScoreOutcome]:
    def thunk() -> ScoreOutcome:
        return normalize_score(fn(*args, **kwargs))

    return thunk


def _outcome(record: tuple[str, Any]) -> ScoreOutcome:
    kind, value = record
    if kind == "ok":
        return value
    return ScoreOutcome(0.0, {}, kind, str(value))


def safe_score_many(
    fn: Callable[..., Any],
    calls: Sequence[tuple[tuple, dict]],
    timeout_s: float = 10.0,
    isolation: str | None = None,
) -> list[ScoreOutcome]:
    """``[safe_score(fn, *args, **kwargs) for args, kwargs in calls]`` with one runner for all.

    Each call has its own ``timeout_s`` budget; a timeout or crash affects only that call.
    ``timeout_s <= 0`` disables the time bound (exceptions and invalid values are still caught).
    """
    thunks = [_scored(fn, tuple(args), dict(kwargs)) for args, kwargs in calls]
    records = run_bounded(thunks, timeout_s, isolation or default_isolation())
    return [_outcome(record) for record in records]


def safe_score(
    fn: Callable[..., Any], *args: Any, timeout_s: float = 10.0, isolation: str | None = None,
    **kwargs: Any,
) -> ScoreOutcome:
    """Call ``fn(*args, **kwargs)`` under the guard -> ``(score, extra, status, message)``.

    >>> safe_score(lambda s: 1, "x", isolation="thread").status
    'ok'
    """
    return safe_score_many(fn, [(args, kwargs)], timeout_s=timeout_s, isolation=isolation)[0]


def run_guarded(thunk: Callable[[], Any], timeout_s: float, isolation: str | None = None) -> tuple[str, Any]:
    """Run one arbitrary thunk under the guard -> ``("ok", value)`` or ``(status, message)``.

    Used by the batch reward manager, whose scorer returns a list rather than one score.
    """
    return run_bounded([thunk], timeout_s, isolation or default_isolation())[0]
