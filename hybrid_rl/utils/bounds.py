"""A number field's valid range, declared beside the field and read by both the checks and the studio.

A config dataclass writes ``ppo_epochs: int = bounded(1, ge=1, fix="...")`` instead of ``= 1`` and a
check in its ``__post_init__``: :func:`check_bounds` (one section, raising the house-style
``ValueError``) and :func:`bound_problems` (a whole config tree, every problem as one line) read the
declaration, and the studio's form puts the same range on the field's number input. Rules that
depend on another key (a mini-batch that divides the batch) stay in the cross-field checks.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

BOUNDS_KEY = "hybrid_rl.bounds"
"""The ``dataclasses.field`` metadata key holding a field's :class:`Bounds`."""


@dataclass(frozen=True)
class Bounds:
    """The closed or open interval a number field must lie in (``None`` = unbounded on that side)."""

    low: Optional[float] = None
    """The lower end, or ``None``."""
    low_open: bool = False
    """The lower end itself is invalid (``> low`` rather than ``>= low``)."""
    high: Optional[float] = None
    """The upper end, or ``None``."""
    high_open: bool = False
    """The upper end itself is invalid (``< high`` rather than ``<= high``)."""
    fix: str = ""
    """The fix-it half of the message (default: ``use a value <rule>``)."""

    def holds(self, value: float) -> bool:
        """``value`` lies in the interval; NaN and +-inf lie in none (an ``lr=inf`` would ruin the
        weights at the first step, so no range is open-ended up to infinity)."""
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    @property
    def rule(self) -> str:
        """The interval in words: ``>= 1``, ``> 0``, ``in (0, 1]``."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{_num(self.low)}, "
                    f"{_num(self.high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return "any finite number"

    def as_json(self) -> dict[str, Any]:
        """The interval for the studio's page (``min``/``max`` of the number input, the rule as text)."""
        return {"low": self.low, "low_open": self.low_open, "high": self.high, "high_open": self.high_open,
                "rule": self.rule}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


def bounded(default: Any, *, ge: Optional[float] = None, gt: Optional[float] = None, le: Optional[float] = None,
            lt: Optional[float] = None, fix: str = "") -> Any:
    """A dataclass field with ``default`` whose value must satisfy the given bounds (``None`` passes when
    the annotation is ``Optional``); ``fix`` says what to set instead."""
    if ge is not None and gt is not None or le is not None and lt is not None:
        raise TypeError("bounded(): give at most one of ge/gt and one of le/lt")
    bounds = Bounds(low=gt if gt is not None else ge, low_open=gt is not None,
                    high=lt if lt is not None else le, high_open=lt is not None, fix=fix)
    return dataclasses.field(default=default, metadata={BOUNDS_KEY: bounds})


def field_bounds(field: dataclasses.Field) -> Optional[Bounds]:
    """The :class:`Bounds` declared on a dataclass field, if any."""
    return field.metadata.get(BOUNDS_KEY)


FINITE = Bounds(fix="use a finite number")
"""The range of a ``float`` field that declares none: any finite number (NaN and +-inf are refused)."""


def _is_float_annotation(hint: Any) -> bool:
    """``float`` or ``Optional[float]``."""
    return hint is float or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                             and set(typing.get_args(hint)) == {float, type(None)})


@lru_cache(maxsize=None)
def _bounded_fields(cls: type) -> tuple[tuple[str, Bounds, bool], ...]:
    """``(name, bounds, null allowed)`` of every bounded field of ``cls``, and of every ``float`` field
    without declared bounds (:data:`FINITE`)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        bounds = field_bounds(f) or (FINITE if _is_float_annotation(hints[f.name]) else None)
        if bounds is not None:
            out.append((f.name, bounds, type(None) in typing.get_args(hints[f.name])))
    return tuple(out)


def _problem(key: str, value: Any, bounds: Bounds, nullable: bool) -> Optional[str]:
    """The house-style line for a value outside its bounds, or ``None``."""
    if value is None and nullable:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and bounds.holds(value) or bounds is FINITE and not isinstance(value, float):
        return None  # an undeclared float field is only checked for NaN / inf
    if number and not math.isfinite(value):
        rule = f"must be a finite number{'' if bounds is FINITE else ' ' + bounds.rule}"
    else:
        rule = ("must be a number " + bounds.rule) if not number else f"must be {bounds.rule}"
    rule += " or null" if nullable else ""
    fix = bounds.fix or f"use a value {bounds.rule}"
    return f"{key}={value!r} is invalid: {rule}. Fix: {fix}."


def check_bounds(obj: Any, prefix: str) -> None:
    """Raise the house-style ``ValueError`` for the first of ``obj``'s own bounded fields out of range;
    ``prefix`` names the section in the message (``actor`` -> ``actor.ppo_epochs=0 is invalid: ...``)."""
    for name, bounds, nullable in _bounded_fields(type(obj)):
        problem = _problem(f"{prefix}.{name}", getattr(obj, name), bounds, nullable)
        if problem:
            raise ValueError(problem)


def bound_problems(obj: Any, prefix: str = "") -> list[str]:
    """One line per bounded field out of range anywhere in the dataclass tree ``obj``, keys dotted from
    its root (``data.train_batch_size=0 is invalid: must be >= 1. Fix: ...``)."""
    problems, bounded_here = [], {name: (b, nullable) for name, b, nullable in _bounded_fields(type(obj))}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            problems.extend(bound_problems(value, f"{prefix}{f.name}."))
        elif f.name in bounded_here:
            problem = _problem(prefix + f.name, value, *bounded_here[f.name])
            if problem:
                problems.append(problem)
    return problems
