"""A name -> function registry whose entries describe themselves, shared by the algorithm families.

Each entry carries an *info* object (a frozen dataclass per family, e.g.
:class:`~hybrid_rl.algorithms.advantage.AdvEstimatorInfo`) saying what the entry needs from a run
(a critic, groups of responses, rollout log-probs, ...). The driver, the config checks, the veRL
notices and the studio read that info through the family's public functions and never name an
entry, so a user-registered estimator that needs groups gets the same checks as ``grpo``.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)
I = TypeVar("I")  # noqa: E741 - the family's info dataclass
_SENTENCE_END = re.compile(r"(?<!\bal)(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z(`])")


def first_doc_line(fn: Callable) -> str:
    """The first sentence of ``fn``'s docstring on one line ('' when it has none): an entry's default
    description."""
    paragraph = (inspect.getdoc(fn) or "").strip().split("\n\n")[0]
    text = " ".join(paragraph.split())
    end = _SENTENCE_END.search(text)  # not after "et al." / "e.g." / "i.e."
    return text if end is None else text[:end.start() + 1]


class Registry(Generic[I]):
    """Maps names to functions and their info; rejects duplicates and lists the known names on a miss.

    Args:
        kind: what is registered, used in error messages (e.g. ``"advantage estimator"``).
        config_key: the config key users set to pick an entry (e.g. ``"algorithm.adv_estimator"``).
    """

    def __init__(self, kind: str, config_key: str):
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, Callable] = {}
        self._infos: dict[str, I] = {}

    def register(self, name: str, info: I) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` with ``info``; a second registration of a name raises."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._fns:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._fns[name].__module__}."
                    f"{self._fns[name].__qualname__}); pick a different name for "
                    f"{fn.__module__}.{fn.__qualname__}"
                )
            self._fns[name] = fn
            self._infos[name] = info
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a no-op when it is not registered): tests and plugin reloads."""
        self._fns.pop(name, None)
        self._infos.pop(name, None)

    def _check(self, name: str) -> None:
        if name not in self._fns:
            raise ValueError(
                f"unknown {self.kind} {name!r} ({self.config_key}); registered: {self.names()}. "
                f"Set {self.config_key} to one of them or register your own first."
            )

    def get(self, name: str) -> Callable:
        """The function registered under ``name``; ValueError naming the valid choices otherwise."""
        self._check(name)
        return self._fns[name]

    def info(self, name: str) -> I:
        """What the entry ``name`` needs (its info object); ValueError naming the valid choices otherwise."""
        self._check(name)
        return self._infos[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)

    def describe(self) -> dict[str, I]:
        """Every entry's info, by name (sorted)."""
        return {name: self._infos[name] for name in self.names()}

    def __contains__(self, name: object) -> bool:
        return name in self._fns
