"""A tiny name -> function registry shared by the advantage-estimator and policy-loss families."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """Maps names to functions; rejects duplicates and lists the known names on a miss.

    Args:
        kind: what is registered, used in error messages (e.g. ``"advantage estimator"``).
        config_key: the config key users set to pick an entry (e.g. ``"algorithm.adv_estimator"``).
    """

    def __init__(self, kind: str, config_key: str):
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; a second registration of a name raises ValueError."""
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
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        """The function registered under ``name``; ValueError naming the valid choices otherwise."""
        if name not in self._fns:
            raise ValueError(
                f"unknown {self.kind} {name!r} ({self.config_key}); registered: {self.names()}. "
                f"Set {self.config_key} to one of them or register your own first."
            )
        return self._fns[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns
