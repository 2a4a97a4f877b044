"""Full dotted keys in the one-line errors of nested config sections.

A section's own check (``__post_init__``) names its keys relative to itself: ``FSDPConfig`` says
``fsdp_config.layer_wrap='layers' is invalid: ...`` whether it sits under the actor, the reference or
the critic. When such an error comes out of a composed config, :func:`qualify_error` finds the
deepest section that fails on its own and completes the key from the section's place in the tree
(``actor_rollout_ref.actor.fsdp_config.layer_wrap=...``), so a YAML with several such sections names
the one to fix; keys the fix names from the same start are completed too. The agent sections
(``rollout.multi_turn``, ``rollout.agent``) rely on it: they sit under ``actor_rollout_ref.`` in
PPO and at the root in SFT.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf


def failing_section(cfg: DictConfig, message: str) -> tuple[str, DictConfig]:
    """The dotted path and node of the deepest section under ``cfg`` whose own conversion to its
    dataclass raises a ``ValueError`` reading ``message`` (``("", cfg)`` when only ``cfg`` does)."""
    path: list[str] = []
    node = cfg
    while (child := _failing_child(node, message)) is not None:
        path.append(child[0])
        node = child[1]
    return ".".join(path), node


def _failing_child(node: Any, message: str) -> Optional[tuple[str, DictConfig]]:
    """``(relative dotted path, section)`` of the first typed section under ``node`` whose own
    conversion raises ``message``; plain mappings and lists on the way are looked through (a
    section under ``teacher_models.<name>`` is found with its name in the path)."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        try:
            child = node[key]
        except Exception:  # noqa: BLE001 - a missing or unresolvable value is not this error's section
            continue
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            if _raises(child, message):
                return str(key), child
        elif isinstance(child, (DictConfig, ListConfig)):
            inner = _failing_child(child, message)
            if inner is not None:
                return f"{key}.{inner[0]}", inner[1]
    return None


def _raises(section: DictConfig, message: str) -> bool:
    try:
        OmegaConf.to_object(section)
    except Exception as error:  # noqa: BLE001 - another error is not the one being placed
        return isinstance(error, ValueError) and str(error) == message
    return False


def qualified_key(key: str, section: str, fields: tuple[str, ...] = ()) -> str:
    """``key`` (relative to a section at dotted ``section``) completed from the tree's root.

    The key's leading segments overlap the section path's trailing ones (``optim.lr`` in
    ``critic.optim`` -> ``critic.optim.lr``); a key starting with one of the section's own
    ``fields`` sits right under it. A key already full, or one that fits neither way, is kept."""
    parts, place = key.split("."), section.split(".") if section else []
    if not place or key.startswith(section + "."):
        return key
    for n in range(min(len(place), len(parts) - 1), 0, -1):
        if place[-n:] == parts[:n]:
            return ".".join(place[:-n] + parts)
    return f"{section}.{key}" if parts[0] in fields else key


def qualify_error(cfg: DictConfig, error: ValueError) -> ValueError:
    """``error`` with the key it opens with (``<key>=<value> is invalid: ...``) completed by
    :func:`qualified_key` for the section of ``cfg`` that raised it; ``error`` itself when its
    message names no key or comes from the root."""
    message = str(error)
    key, sep, rest = message.partition("=")
    if not sep or not key or " " in key:
        return error
    section, node = failing_section(cfg, message)
    if not section:
        return error
    full = qualified_key(key, section, _field_names(node))
    if full == key or not full.endswith("." + key):
        return error
    return ValueError(full + sep + complete_keys(rest, key, full[: -len(key)]))


def complete_keys(text: str, key: str, head: str) -> str:
    """``text`` (the rest of a message) with the other keys it names from the same relative start
    as ``key`` (``Fix: set rollout.multi_turn.enable=true``) completed by ``head``
    (``actor_rollout_ref.``), as the message's own key was. A one-segment key names nothing to
    complete."""
    first, dot, _ = key.partition(".")
    if not dot:
        return text
    return re.sub(rf"(?<![\w.]){re.escape(first)}\.", lambda m: head + m.group(0), text)


def _field_names(section: DictConfig) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(OmegaConf.get_type(section)))
