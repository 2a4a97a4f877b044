"""The one name -> entry registry behind every registry of the package.

An entry is a function or a class (an advantage estimator, a policy loss, a reward scorer, a tool
class, a rollout engine's builder, ...) registered under a name, with an *info* object saying what
it is and needs (a frozen dataclass per family, e.g.
:class:`~hybrid_rl.algorithms.advantage.AdvEstimatorInfo`; every info has a one-line
``description``). The driver, the config checks, the veRL notices, ``--help`` and the studio read
that info through the family's public functions and never name an entry, so a user-registered
estimator that needs groups gets the same checks as ``grpo``.

Each registry lists itself on creation (:func:`all_registries`): ``--help`` prints every one with
the config key that picks an entry (:mod:`hybrid_rl.trainer.registry_help`). A family keeps its own
words where users have learnt them: ``duplicate_error`` / ``unknown_error`` build its one-line
messages, and ``may_replace`` says when a second registration of a name silently replaces the first
(the same class redefined by a re-run notebook cell) instead of raising.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Generic, Iterator, Mapping, Optional, Sequence, TypeVar

__all__ = ["EntryInfo", "NameView", "Registry", "all_registries", "first_doc_line", "same_definition",
           "same_object"]

F = TypeVar("F")
I = TypeVar("I")  # noqa: E741 - the family's info dataclass
_SENTENCE_END = re.compile(r"(?<!\bal)(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z(`])")
_ALL: list["Registry"] = []


def first_doc_line(fn: Any) -> str:
    """The first sentence of ``fn``'s docstring on one line ('' when it has none): an entry's default
    description."""
    paragraph = (inspect.getdoc(fn) or "").strip().split("\n\n")[0]
    text = " ".join(paragraph.split())
    end = _SENTENCE_END.search(text)  # not after "et al." / "e.g." / "i.e."
    return text if end is None else text[:end.start() + 1]


@dataclass(frozen=True)
class EntryInfo:
    """The info of a family that records nothing but a description."""

    description: str = ""
    """One line for listings (``--help``, the studio); default: the entry's first docstring sentence."""


def _where(entry: Any) -> str:
    """``module.qualname`` of an entry (its repr when it has none)."""
    qualname = getattr(entry, "__qualname__", None)
    return f"{getattr(entry, '__module__', '?')}.{qualname}" if qualname else repr(entry)


def same_object(old: Any, new: Any) -> bool:
    """``may_replace`` policy: only the very same object registers again (a no-op)."""
    return old is new


def same_definition(old: Any, new: Any) -> bool:
    """``may_replace`` policy: the same object, or one defined again under the same module and
    qualified name (a re-run notebook cell, a reloaded module), replaces the old one."""
    key = lambda e: (getattr(e, "__module__", None), getattr(e, "__qualname__", None))  # noqa: E731
    return old is new or (key(old) == key(new) and key(old)[1] is not None)


def _default_duplicate_error(kind: str) -> Callable[[str, Any, Any], str]:
    def message(name: str, old: Any, new: Any) -> str:
        return (f"{kind} {name!r} is already registered (by {_where(old)}); pick a different name for "
                f"{_where(new)}")
    return message


class Registry(Generic[I]):
    """Maps names to entries and their info; rejects duplicates and lists the known names on a miss.

    Args:
        kind: what is registered, used in error messages (e.g. ``"advantage estimator"``).
        config_key: where users pick an entry (e.g. ``"algorithm.adv_estimator"``; a YAML field
            such as ``"tools[].class_name"`` for registries read from files).
        may_replace: ``(old, new) -> bool``: a second registration of a name replaces the first
            when true; default: never (it raises).
        duplicate_error: ``(name, old, new) -> str``: the one-line message of a refused duplicate.
        unknown_error: ``(name, registered names) -> str``: the one-line message of an unknown name.
        listed: list it in :func:`all_registries` (false for copies made by tests).
        aliases: other keys that pick an entry (the same setting's path in another mode's config
            tree), listed by ``--help`` too.
    """

    def __init__(self, kind: str, config_key: str, *, may_replace: Optional[Callable[[Any, Any], bool]] = None,
                 duplicate_error: Optional[Callable[[str, Any, Any], str]] = None,
                 unknown_error: Optional[Callable[[str, list[str]], str]] = None, listed: bool = True,
                 aliases: tuple[str, ...] = ()):
        self.kind = kind
        self.config_key = config_key
        self.aliases = tuple(aliases)
        self._may_replace = may_replace
        self._duplicate_error = duplicate_error or _default_duplicate_error(kind)
        self._unknown_error = unknown_error
        self._entries: dict[str, Any] = {}
        self._infos: dict[str, Any] = {}
        if listed:
            _ALL.append(self)

    # ------------------------------------------------------------------ adding and removing entries
    def check_free(self, name: str, entry: Any) -> None:
        """Raise the duplicate ValueError when ``name`` holds another entry that ``entry`` may not replace."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._entries:
            old = self._entries[name]
            if self._may_replace is None or not self._may_replace(old, entry):
                raise ValueError(self._duplicate_error(name, old, entry))

    def add(self, name: str, entry: F, info: Optional[I] = None, *, force: bool = False) -> F:
        """Put ``entry`` under ``name`` (``info`` default: an :class:`EntryInfo` with the entry's first
        docstring sentence); a duplicate raises unless ``force`` or the ``may_replace`` policy allows it."""
        if not force:
            self.check_free(name, entry)
        self._entries[name] = entry
        self._infos[name] = EntryInfo(description=first_doc_line(entry)) if info is None else info
        return entry

    def register(self, name: str, info: Optional[I] = None) -> Callable[[F], F]:
        """Decorator registering a function or class under ``name`` with ``info``; a duplicate raises."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")

        def decorator(entry: F) -> F:
            return self.add(name, entry, info)

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a no-op when it is not registered): tests and plugin reloads."""
        self._entries.pop(name, None)
        self._infos.pop(name, None)

    def copy(self) -> "Registry[I]":
        """An unlisted copy with the same entries and rules (a test swaps it in, leaving no entry behind)."""
        clone: Registry[I] = Registry(self.kind, self.config_key, may_replace=self._may_replace,
                                      duplicate_error=self._duplicate_error, unknown_error=self._unknown_error,
                                      listed=False, aliases=self.aliases)
        clone._entries, clone._infos = dict(self._entries), dict(self._infos)
        return clone

    # ------------------------------------------------------------------ looking entries up
    def _check(self, name: str) -> None:
        if name not in self._entries:
            if self._unknown_error is not None:
                raise ValueError(self._unknown_error(name, self.names()))
            raise ValueError(
                f"unknown {self.kind} {name!r} ({self.config_key}); registered: {self.names()}. "
                f"Set {self.config_key} to one of them or register your own first."
            )

    def get(self, name: str) -> Any:
        """The entry registered under ``name``; ValueError naming the valid choices otherwise."""
        self._check(name)
        return self._entries[name]

    def find(self, name: str) -> Optional[Any]:
        """The entry registered under ``name``, or None (a family that falls back to a dotted path)."""
        return self._entries.get(name)

    def info(self, name: str) -> I:
        """What the entry ``name`` is and needs (its info object); ValueError naming the valid choices otherwise."""
        self._check(name)
        return self._infos[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def name_view(self) -> "NameView":
        """A live, read-only sequence of the names in registration order (a module constant that
        follows later registrations)."""
        return NameView(self)

    def entry_view(self) -> Mapping[str, Any]:
        """A live, read-only ``name -> entry`` mapping (a module constant that follows later registrations)."""
        return MappingProxyType(self._entries)

    def entries(self) -> dict[str, Any]:
        """Every entry by name, in registration order (a snapshot)."""
        return dict(self._entries)

    def describe(self) -> dict[str, I]:
        """Every entry's info, by name (sorted)."""
        return {name: self._infos[name] for name in self.names()}

    def descriptions(self) -> dict[str, str]:
        """Every entry's one-line description, by name (sorted)."""
        return {name: str(getattr(info, "description", "") or "") for name, info in self.describe().items()}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.config_key!r}, names={self.names()})"


class NameView(Sequence[str]):
    """The names of a :class:`Registry` in registration order, read at each use; prints as a tuple."""

    def __init__(self, registry: Registry):
        self._registry = registry

    def _names(self) -> tuple[str, ...]:
        return tuple(self._registry._entries)

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._registry)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, NameView)) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


def all_registries() -> list[Registry]:
    """Every listed registry, in creation order (``--help`` and the studio read it)."""
    return list(_ALL)
