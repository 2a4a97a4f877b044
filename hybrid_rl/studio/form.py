"""The studio's values: checked by the CLI's own validation, written as YAML or a command line, read back.

A form state is ``{dotted key: value}`` of the keys that differ from the defaults (Python values:
``None``, bools, numbers, strings, lists, dicts). Everything goes through the same path as
``python -m hybrid_rl.trainer.main_ppo key=value ...``: the values become Hydra overrides, Hydra
composes them over ``ppo_trainer.yaml`` and the typed schema, :func:`to_ppo_config` runs every
section's checks and :func:`validate_config` the cross-field rules. So the page cannot accept what
the command line refuses, and its messages are the command line's, attached to the key they name.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, Optional

import yaml

from hybrid_rl.studio.schema import config_schema, yaml_defaults

FORM_LEVEL = ""
"""The key under which :func:`check_values` files a message that names no config key."""

_BARE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./\-]*$")
_RESERVED = {"null", "true", "false", "nan", "inf", "-inf", "none", "yes", "no", "on", "off"}


def format_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (``null``, ``true``, ``1e-06``, ``'a b'``, ``[1,2]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _BARE.match(value) and value.lower() not in _RESERVED:
            return value
        # Hydra keeps a backslash literal unless a quote (or the closing quote) follows it
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
        return "'" + escaped.replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"{value!r} ({type(value).__name__}) cannot be written as a config value; use a "
                     "number, a string, true/false, null, a list or a mapping")


def to_overrides(values: Mapping[str, Any]) -> list[str]:
    """``["key=value", ...]`` for the CLI (and Hydra's compose), in the given order. A mapping-valued
    field (``override_config``) is written entry by entry, ``+key.entry=value``: Hydra adds keys to
    such a dict only that way."""
    overrides = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            overrides += [f"+{key}.{entry}={format_value(v)}" for entry, v in value.items()]
        else:
            overrides.append(f"{key}={format_value(value)}")
    return overrides


def command_line(values: Mapping[str, Any]) -> str:
    """The equivalent ``python -m hybrid_rl.trainer.main_ppo ...`` line, shell-quoted."""
    import shlex

    return " ".join(["python", "-m", "hybrid_rl.trainer.main_ppo", *map(shlex.quote, to_overrides(values))])


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``{key: value}`` of ``key=value`` overrides (Hydra's parser; the inverse of :func:`to_overrides`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, values = OverridesParser.create(), {}
    mappings = [f.key for f in config_schema()[0] if f.kind == "dict"]
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except OverrideParseException as error:
            raise ValueError(f"cannot parse {text!r}: {str(error).splitlines()[0]}. Fix: write key=value") from None
        if override.is_sweep_override():
            raise ValueError(f"{text!r} is a sweep (several values); the studio configures one run. Fix: quote "
                             "a value holding commas (key='a,b') or write a list as key=[a,b]")
        key, value = override.key_or_group, _plain(override.value())
        owner = next((m for m in mappings if key.startswith(m + ".")), None)
        if owner:  # +key.entry=value of a mapping-valued field
            values.setdefault(owner, {})[key[len(owner) + 1:]] = value
        else:
            values[key] = value
    return values


def parse_command_line(line: str) -> dict[str, Any]:
    """``{key: value}`` of a ``main_ppo`` command line (with or without ``python -m ...``)."""
    import shlex

    words = shlex.split(line)
    if "hybrid_rl.trainer.main_ppo" in words:
        words = words[words.index("hybrid_rl.trainer.main_ppo") + 1:]
    return parse_overrides(w for w in words if "=" in w)


def _plain(value: Any) -> Any:
    """Hydra's parsed values as plain Python (its lists and dicts are already plain)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _leaves(tree: Mapping[str, Any], prefix: str, leaf_keys: set[str]) -> Iterable[tuple[str, Any]]:
    for key, value in tree.items():
        path = prefix + key
        if path not in leaf_keys and isinstance(value, Mapping):
            yield from _leaves(value, path + ".", leaf_keys)
        else:
            yield path, value


def changed_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that differ from the defaults (what a command line needs)."""
    defaults = dict(_leaves(yaml_defaults(), "", {f.key for f in config_schema()[0]}))
    return {k: v for k, v in values.items() if k not in defaults or defaults[k] != v}


def to_yaml(values: Mapping[str, Any]) -> str:
    """The whole config with ``values`` applied, as a YAML file ``main_ppo`` accepts
    (``--config-path DIR --config-name NAME``, the file being ``DIR/NAME.yaml``). It stands alone:
    its defaults name only the registered schema, and it carries the package YAML's ``hydra:``
    section. Interpolations stay as the defaults write them."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.loader import CONFIG_DIR, CONFIG_NAME, SCHEMA_NAME

    package = OmegaConf.to_container(OmegaConf.load(f"{CONFIG_DIR}/{CONFIG_NAME}.yaml"), resolve=False)
    tree = yaml.safe_load(yaml.safe_dump(yaml_defaults()))  # a deep copy of plain data
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    tree = {"defaults": [SCHEMA_NAME, "_self_"], "hydra": package["hydra"], **tree}
    return yaml.safe_dump(tree, sort_keys=False)


def values_from_yaml(text: str) -> dict[str, Any]:
    """The non-default values of a YAML written by :func:`to_yaml` (or any file of the same keys)."""
    tree = yaml.safe_load(text) or {}
    if not isinstance(tree, Mapping):
        raise ValueError("the YAML must be a mapping of config sections (data:, actor_rollout_ref:, ...)")
    tree = {k: v for k, v in tree.items() if k not in ("defaults", "hydra")}
    leaf_keys = {f.key for f in config_schema()[0]}
    return changed_values(dict(_leaves(tree, "", leaf_keys)))


def _named(message: str, keys: Iterable[str], relative: bool) -> list[str]:
    """The keys ``message`` names in full, or (``relative``) without their top section, as the
    sections' own checks write them (``rollout.name``)."""
    found = []
    for key in keys:
        text = key.split(".", 1)[-1] if relative else key
        if (not relative or "." in text) and re.search(rf"(?<![\w.]){re.escape(text)}(?![\w])", message):
            found.append(key)
    return found


def _owner(message: str, edited: list[str], keys: list[str]) -> str:
    """The key a message belongs to: a full key it names (an edited one first), else a key it names
    relative to its section (an edited one first), else :data:`FORM_LEVEL`; the longest wins."""
    for relative in (False, True):
        for candidates in (edited, keys):
            named = _named(message, candidates, relative)
            if named:
                return max(named, key=len)
    return FORM_LEVEL


def check_values(values: Mapping[str, Any],
                 confine: Optional[Callable[[Any], dict[str, str]]] = None) -> dict[str, str]:
    """``{key: message}`` of what the command line would refuse; ``{}`` when the run would start.

    Runs the CLI's composition, section checks and :func:`validate_config`. Each message goes to
    the key it names (the value's own key first when it names several), or to :data:`FORM_LEVEL`.
    ``confine(config)``, given the composed config before any check looks at the disk, answers
    ``{key: message}`` of paths the caller refuses to look at; when it answers any, they are the
    answer and nothing else is checked (the studio: paths outside its folders).
    """
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
    from hybrid_rl.trainer.config.checks import validate_config
    from hybrid_rl.utils.log_setup import recorded_config_notices

    keys = [f.key for f in config_schema()[0]]
    from omegaconf.errors import OmegaConfBaseException

    try:
        overrides = to_overrides(values)
        with recorded_config_notices():  # a deprecated key is the launched run's notice, not the server's
            config = to_ppo_config(get_config(overrides))
            refused = confine(config) if confine is not None else {}
            if refused:
                return refused
            validate_config(config)
    except (ValueError, TypeError, OmegaConfBaseException) as error:
        lines = [line.removeprefix("- ") for line in str(error).splitlines() if line.strip()]
        if len(lines) > 1 and lines[0].endswith("config problems:"):
            lines = lines[1:]
        edited, errors = [k for k in keys if k in values], {}
        for line in lines:
            errors.setdefault(_owner(line, edited, keys), line)
        return errors
    return {}
