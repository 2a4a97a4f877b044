"""Full dotted keys in the one-line errors and notices of nested config sections.

A section's own check (``__post_init__``) names its keys relative to itself: ``FSDPConfig`` says
``fsdp_config.layer_wrap='layers' is invalid: ...`` whether it sits under the actor, the reference or
the critic. When such an error comes out of a composed config, :func:`qualify_error` finds the
deepest section that fails on its own and completes the key from the section's place in the tree
(``actor_rollout_ref.actor.fsdp_config.layer_wrap=...``), so a YAML with several such sections names
the one to fix; keys the fix names from the same start are completed too. The agent sections
(``rollout.multi_turn``, ``rollout.agent``) rely on it: they sit under ``actor_rollout_ref.`` in
PPO and at the root in SFT. :func:`qualify_warnings` does the same for the deprecation notices a
section gives as it is built (``actor.ppo_micro_batch_size is deprecated`` ->
``actor_rollout_ref.actor.ppo_micro_batch_size is deprecated``), once per section that gives it.

A key that was not set but follows another (``actor_rollout_ref.rollout.prompt_length`` holds
``${data.max_prompt_length}``) is blamed on the key the user set: :func:`name_the_source`.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Callable, Iterator, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

_LEADING_KEY = re.compile(r"([A-Za-z_][\w.]*)(?==| is )")
"""The dotted key a house-style message opens with (``<key>=<value> is invalid``, ``<key> is deprecated``)."""
_PLAIN_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def sections_where(cfg: Any, holds: Callable[[DictConfig], bool]) -> Iterator[tuple[str, DictConfig]]:
    """``(dotted path, section)`` of every deepest typed section under ``cfg`` for which ``holds``
    is true, in the tree's order (a section that holds but has a child that holds yields the child).
    Plain mappings and lists on the way are looked through (a section under
    ``teacher_models.<name>`` comes with its name in the path)."""
    keys = cfg.keys() if isinstance(cfg, DictConfig) else range(len(cfg))
    for key in keys:
        try:
            child = cfg[key]
        except Exception:  # noqa: BLE001 - a missing or unresolvable value is no section to probe
            continue
        typed = isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child))
        if typed and not holds(child):
            continue
        if typed or isinstance(child, (DictConfig, ListConfig)):
            found = False
            for path, section in sections_where(child, holds):
                found = True
                yield f"{key}.{path}", section
            if typed and not found:
                yield str(key), child


def failing_section(cfg: DictConfig, message: str) -> tuple[str, DictConfig]:
    """The dotted path and node of the deepest section under ``cfg`` whose own conversion to its
    dataclass raises a ``ValueError`` reading ``message`` (``("", cfg)`` when only ``cfg`` does)."""
    return next(sections_where(cfg, lambda section: _raises(section, message)), ("", cfg))


def _raises(section: DictConfig, message: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a probe's notices were given by the conversion itself
        try:
            OmegaConf.to_object(section)
        except Exception as error:  # noqa: BLE001 - another error is not the one being placed
            return isinstance(error, ValueError) and str(error) == message
    return False


def _warns(section: DictConfig, message: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            OmegaConf.to_object(section)
        except Exception:  # noqa: BLE001 - a section that fails gives its notice before or not at all
            pass
    return any(str(w.message) == message for w in caught)


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


def leading_key(message: str) -> Optional[str]:
    """The dotted key a house-style message opens with, or ``None``."""
    match = _LEADING_KEY.match(message)
    return match.group(1) if match else None


def qualified_message(message: str, section: str, node: DictConfig) -> str:
    """``message`` (from the section at ``section``) with its leading key and the keys its fix
    names from the same start completed from the root; ``message`` itself when they cannot be."""
    key = leading_key(message)
    if not key or not section:
        return message
    full = qualified_key(key, section, _field_names(node))
    if full == key or not full.endswith("." + key):
        return message
    return full + complete_keys(message[len(key):], key, full[: -len(key)])


def qualify_error(cfg: DictConfig, error: ValueError) -> ValueError:
    """``error`` with the key it opens with (``<key>=<value> is invalid: ...``) completed by
    :func:`qualified_key` for the section of ``cfg`` that raised it and blamed on the key it follows
    (:func:`name_the_source`); ``error`` itself when there is nothing to change."""
    message = str(error)
    if not leading_key(message):
        return error
    text = name_the_source(cfg, qualified_message(message, *failing_section(cfg, message)))
    return error if text == message else ValueError(text)


def qualify_warnings(cfg: DictConfig, messages: list[str]) -> list[str]:
    """The notices ``messages`` (given while ``cfg`` was converted) with their keys completed: one
    per section that gives each (the actor's and the critic's ``optim.warmup_style`` are two), in
    the tree's order; a notice no section gives alone is kept as it is."""
    out: list[str] = []
    for message in dict.fromkeys(messages):
        placed = [qualified_message(message, path, node) for path, node in
                  sections_where(cfg, lambda section: _warns(section, message))] if leading_key(message) else []
        out.extend(dict.fromkeys(placed) or [message])
    return out


def name_the_source(cfg: DictConfig, message: str) -> str:
    """``message`` blamed on the key its leading key follows, when that key was not set itself and
    holds a plain ``${other.key}`` (a linked default, followed to its end):
    ``actor_rollout_ref.rollout.prompt_length=-9 is invalid: ...`` ->
    ``data.max_prompt_length=-9 is invalid: ... (actor_rollout_ref.rollout.prompt_length follows it)``."""
    key = leading_key(message)
    source, seen = key, set()
    while source and source not in seen:
        seen.add(source)
        target = _interpolation_target(cfg, source)
        if target is None:
            break
        source = target
    if not key or source == key:
        return message
    text = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])", source, message)
    note = f" ({key} follows it)"
    head, fix, tail = text.partition(". Fix:")
    return head + note + fix + tail if fix else text.rstrip(".") + note + "."


def _interpolation_target(cfg: DictConfig, key: str) -> Optional[str]:
    """The key ``key`` holds as a plain ``${other.key}`` in ``cfg``, or ``None``."""
    parent_path, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_path, throw_on_missing=False) if parent_path else cfg
        if not isinstance(parent, DictConfig) or leaf not in parent or not OmegaConf.is_interpolation(parent, leaf):
            return None
        raw = parent._get_node(leaf)._value()  # noqa: SLF001 - the unresolved ${...} text
    except Exception:  # noqa: BLE001 - an unreadable node names no source
        return None
    match = _PLAIN_INTERPOLATION.fullmatch(str(raw))
    return match.group(1) if match else None


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
