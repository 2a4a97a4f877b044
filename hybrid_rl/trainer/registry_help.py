"""``--help``'s listing of every registry: the key or YAML field that picks an entry, and each entry
with its one-line description and what it needs.

The registries list themselves when they are created (:func:`hybrid_rl.utils.registry.all_registries`);
this module imports the packages that create them (:data:`REGISTRY_MODULES`), so a new registry in
one of them is listed without an edit here, and entries a user registered in this process (a
notebook, a plugin imported first) are listed with the built-ins.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from hybrid_rl.utils.registry import Registry, all_registries

__all__ = ["REGISTRY_MODULES", "entry_line", "registry_help", "registry_notes"]

REGISTRY_MODULES = (
    "hybrid_rl.algorithms",  # advantage estimators, policy losses
    "hybrid_rl.algorithms.distillation",
    "hybrid_rl.objectives",
    "hybrid_rl.reward",  # reward functions by data_source, reward managers
    "hybrid_rl.agents",  # tools, interactions, environments, agent loops
    "hybrid_rl.workers.rollout",  # rollout engines
)
"""The packages whose import creates the registries and registers their built-in entries."""


def _registries() -> list[Registry]:
    for module in REGISTRY_MODULES:
        importlib.import_module(module)
    return all_registries()


def _flags(info: Any) -> list[str]:
    """What an entry needs or does, from its info's fields: ``needs_*`` flags that are set, the
    devices it runs on and the engine it falls back to."""
    if not dataclasses.is_dataclass(info):
        return []
    values = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    flags = [name.replace("_", " ") for name, value in values.items() if name.startswith("needs_") and value is True]
    if values.get("devices"):
        flags.append("runs on " + ", ".join(values["devices"]))
    if values.get("fallback"):
        flags.append(f"falls back to {values['fallback']}")
    return flags


def entry_line(name: str, info: Any) -> str:
    """``name [flags]: description`` (the format of ``--help``'s estimator and loss lines)."""
    flags = _flags(info)
    head = f"{name} [{', '.join(flags)}]" if flags else name
    description = str(getattr(info, "description", "") or "")
    return f"{head}: {description}" if description else head


def registry_notes() -> dict[str, list[str]]:
    """Every registry's entries under the config key that picks one (``ModeSpec.help_notes``'s
    ``{key: lines}``, also under each alias); registries picked in a YAML file carry that file's
    key and field."""
    notes: dict[str, list[str]] = {}
    for registry in _registries():
        lines = [entry_line(name, info) for name, info in registry.describe().items()]
        for key in (registry.config_key, *registry.aliases):
            notes.setdefault(key, []).extend(lines)
    return notes


def registry_help() -> str:
    """The ``--help`` block listing every registry (its kind, the key that picks an entry) and each
    entry with its one-line description."""
    lines = ["Registries (pick an entry by its name at the key shown; register your own with the "
             "family's @register_* decorator before the run starts):"]
    for registry in _registries():
        lines.append(f"  {registry.kind} ({registry.config_key}):")
        described = registry.describe()
        lines += [f"    {entry_line(name, info)}" for name, info in described.items()] or ["    (none registered)"]
    return "\n".join(lines) + "\n"
