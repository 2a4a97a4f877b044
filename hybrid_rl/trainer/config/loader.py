"""Hydra composition of each entry point's YAML over its typed schema.

``main_ppo`` composes ``config/ppo_trainer.yaml`` over :class:`PPOConfig`, ``main_sft``
``sft_trainer.yaml`` over :class:`SFTConfig`, ``main_rm`` ``rm_trainer.yaml`` over :class:`RMConfig`
(:class:`ConfigSchema`). Each dataclass is registered as a Hydra schema (``ppo_trainer_schema``, ...)
that its YAML lists first in its defaults, so every key of the YAML and of the command line must
exist in the dataclasses and have the right type. Before Hydra runs, :func:`check_override_keys` turns a misspelt key into a
one-line error that names the nearest valid key (Hydra's own message does not).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import omegaconf
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybrid_rl.trainer.config.error_paths import qualify_error, qualify_warnings
from hybrid_rl.trainer.config.schema import PPOConfig
from hybrid_rl.trainer.config.supervised import RMConfig, SFTConfig
from hybrid_rl.utils.log_setup import WARNINGS_LOCK, ConfigDeprecationWarning, recorded_config_notices

# The YAMLs sit in this package, beside the dataclasses (schema.py, supervised.py).
CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
_OMEGACONF_DIR = os.path.dirname(os.path.abspath(omegaconf.__file__))
_PACKAGE_DIR = os.path.dirname(os.path.dirname(CONFIG_DIR))  # hybrid_rl/


@dataclass(frozen=True)
class ConfigSchema:
    """One entry point's config: the YAML it composes and the dataclass under it."""

    config_name: str
    """The YAML's name in this package (``ppo_trainer`` = ``ppo_trainer.yaml``)."""
    node: type
    """The dataclass holding every key, its default and its documentation."""
    module: str
    """The entry point's module under ``hybrid_rl.trainer`` (named in messages)."""

    @property
    def schema_name(self) -> str:
        """The name the dataclass is registered under in Hydra's ConfigStore (a YAML's defaults list it)."""
        return f"{self.config_name}_schema"


PPO_SCHEMA = ConfigSchema("ppo_trainer", PPOConfig, "main_ppo")
SFT_SCHEMA = ConfigSchema("sft_trainer", SFTConfig, "main_sft")
RM_SCHEMA = ConfigSchema("rm_trainer", RMConfig, "main_rm")
CONFIG_NAME, SCHEMA_NAME = PPO_SCHEMA.config_name, PPO_SCHEMA.schema_name


def _open_free_form_dicts(node: DictConfig) -> DictConfig:
    """``node`` with its free-form dict fields that are empty by default (``actor.objective``,
    ``model.override_config``) out of struct mode, so ``key={a: 1}`` and ``key.a=1`` set them on the
    command line as ``+key.a=1`` does; every other key stays checked (``teacher_models`` too: its
    default entry keeps its keys)."""
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if OmegaConf.get_type(child) is dict:
                if len(child) == 0:
                    OmegaConf.set_struct(child, False)
            else:
                _open_free_form_dicts(child)
    return node


for _schema in (PPO_SCHEMA, SFT_SCHEMA, RM_SCHEMA):
    ConfigStore.instance().store(name=_schema.schema_name,
                                 node=_open_free_form_dicts(OmegaConf.structured(_schema.node)))


def _valid_keys(node: Any, prefix: str = "") -> tuple[set[str], set[str]]:
    """(every dotted key of the schema, the keys that are free-form dicts accepting any sub-key)."""
    keys, open_dicts = set(), set()
    for key in node.keys():
        path = f"{prefix}{key}"
        keys.add(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if OmegaConf.get_type(child) is dict:
                open_dicts.add(path)
            else:
                sub_keys, sub_open = _valid_keys(child, path + ".")
                keys |= sub_keys
                open_dicts |= sub_open
    return keys, open_dicts


def unknown_key_message(key: str, valid: Iterable[str], module: str = "main_ppo") -> str:
    """'Unknown config key ...; did you mean ...?' with the nearest valid key (difflib)."""
    # Never suggest a group that contains the key ('data' for 'data.foo').
    valid = sorted(k for k in valid if not key.startswith(k + "."))
    # Compare leaf names within the same group first (a typo rarely changes the group), then whole
    # keys with a stricter cutoff (the shared group prefix inflates the similarity).
    group, _, leaf = key.rpartition(".")
    leaves = {k.rpartition(".")[2]: k for k in valid if k.rpartition(".")[0] == group}
    match = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)]
    match = match or difflib.get_close_matches(key, valid, n=1, cutoff=0.85)
    hint = f" Did you mean '{match[0]}'?" if match else ""
    return (
        f"Unknown config key '{key}'.{hint} All keys are listed in "
        f"python -m hybrid_rl.trainer.{module} --help (documented in hybrid_rl/trainer/config/)."
    )


def check_override_keys(overrides: list[str], schema: ConfigSchema = PPO_SCHEMA) -> None:
    """Raise ValueError for the first override whose key is not in ``schema``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    valid, open_dicts = _valid_keys(OmegaConf.structured(schema.node))
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except OverrideParseException as e:
            raise ValueError(
                f"cannot parse the override {text!r} ({str(e).splitlines()[0]}). Fix: write key=value; quote a "
                "value holding brackets, commas or spaces (key='a,b'); lists are key=[1,2]."
            ) from None
        key = override.key_or_group
        if key.startswith("hydra.") or key == "hydra" or override.package is not None:
            continue
        if key in valid or any(key.startswith(d + ".") for d in open_dicts):
            continue
        raise ValueError(unknown_key_message(key, valid, schema.module))


_COMPOSING = threading.Lock()
"""Held while :func:`get_config` composes (Hydra keeps its state in one global)."""


def get_config(overrides: list[str] | None = None, schema: ConfigSchema = PPO_SCHEMA,
               config_dir: Optional[str] = None, config_name: Optional[str] = None) -> DictConfig:
    """Compose the config like ``python -m hybrid_rl.trainer.<schema.module> <overrides>`` (by
    default ``main_ppo``'s); ``config_dir`` / ``config_name``: a user's YAML instead of the package's
    (``--config-path`` / ``--config-name``; its defaults list the schema, e.g. ``sft_trainer_schema``).

    Returns a typed DictConfig (assigning an unknown key or a wrong type raises). Pass it to
    :func:`hybrid_rl.trainer.run_ppo` or :func:`to_typed_config`.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides or [])
    check_override_keys(overrides, schema)
    from hydra.errors import ConfigCompositionException

    with _COMPOSING:  # GlobalHydra is one per process: the studio's request threads compose one at a time
        if GlobalHydra.instance().is_initialized():
            # Inside a Hydra app (or a notebook that used hydra before): compose in a fresh context.
            GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=os.path.abspath(config_dir or CONFIG_DIR), version_base="1.3"):
            try:
                cfg = compose(config_name=config_name or schema.config_name, overrides=overrides)
            except ConfigCompositionException as e:
                raise ValueError(composition_error_message(e)) from None
    return cfg


def composition_error_message(error: Exception) -> str:
    """One line for a failed composition: the key, what is wrong with its value, and the fix."""
    cause = error.__cause__
    full_key, msg = getattr(cause, "full_key", None), getattr(cause, "msg", None)
    if full_key and msg:
        # Hydra keeps the useful part (key, value, expected type) in the OmegaConf cause.
        return (f"{full_key}: {str(msg).splitlines()[0]}. Fix: give {full_key} a value of the type it expects "
                "(documented in hybrid_rl/trainer/config/schema.py).")
    detail = f" ({cause})" if cause else ""
    return f"{error}{detail}".replace("\n", " ")


def to_ppo_config(cfg: Union[DictConfig, PPOConfig]) -> PPOConfig:
    """The typed :class:`PPOConfig` of ``cfg`` (interpolations resolved, group checks run). A
    :class:`PPOConfig` built in Python is resolved the same way (its linked keys follow the keys
    they name, as on the command line)."""
    return to_typed_config(cfg, PPOConfig)


def to_typed_config(cfg: Any, cls: type) -> Any:
    """The typed ``cls`` instance of ``cfg`` (a DictConfig composed over ``cls``'s schema, or a
    ``cls`` built in Python): interpolations resolved, group checks run. Errors and deprecation
    notices of nested sections name their full keys (:mod:`.error_paths`)."""
    if isinstance(cfg, cls):
        if _is_resolved(cfg):
            return cfg
        cfg = OmegaConf.structured(cfg)
    elif not isinstance(cfg, DictConfig) or OmegaConf.get_type(cfg) not in (cls, dict):
        raise TypeError(f"expected a DictConfig from get_config() or a {cls.__name__}, got {type(cfg).__name__}"
                        + (f" of {OmegaConf.get_type(cfg).__name__}" if isinstance(cfg, DictConfig) else ""))
    else:
        cfg = cfg.copy()
        if "hydra" in cfg:
            with _open(cfg):
                cfg.pop("hydra")
    typed = _convert(cfg)
    if not isinstance(typed, cls):
        raise ValueError(f"the YAML config does not name its schema, so its keys are not checked as {cls.__name__}'s: "
                         "start it with the entry point's schema, e.g. 'defaults: [sft_trainer_schema, _self_]' "
                         "(ppo_trainer_schema, sft_trainer_schema or rm_trainer_schema).")
    return typed


def _convert(cfg: DictConfig) -> Any:
    """``OmegaConf.to_object(cfg)`` with its error and its deprecation notices naming full keys.

    Each conversion gives its notices again (a run converts once: ``run_ppo``, the command lines),
    attributed to the first caller outside hybrid_rl; other warnings are shown as they were given.
    """
    typed, error = None, None
    with WARNINGS_LOCK:  # the placing probes below swap the warnings state too
        with recorded_config_notices() as messages:
            try:
                typed = OmegaConf.to_object(cfg)
            except ValueError as raised:
                error = raised
        try:
            error = error if error is None else qualify_error(cfg, error)
            notices = qualify_warnings(cfg, messages) if messages else []
        except Exception:  # noqa: BLE001 - placing the keys is a courtesy; the error and notices must come out
            notices = messages
    level = _caller_stacklevel()
    for text in notices:
        warnings.warn(text, ConfigDeprecationWarning, stacklevel=level)
    if error is not None:
        raise error from None
    return typed


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside hybrid_rl and OmegaConf (the code
    that asked for the config), counted from ``warnings.warn``'s caller."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the frame of _caller_stacklevel's caller
    while frame is not None and frame.f_code.co_filename.startswith((_PACKAGE_DIR + os.sep, _OMEGACONF_DIR + os.sep)):
        frame, level = frame.f_back, level + 1
    return level


def _is_resolved(cfg: PPOConfig) -> bool:
    """True when no value of ``cfg`` is still a ``${...}`` interpolation."""
    def walk(node: Any) -> bool:
        if isinstance(node, str):
            return "${" not in node
        if dataclasses.is_dataclass(node):
            return all(walk(getattr(node, f.name)) for f in dataclasses.fields(node))
        if isinstance(node, (list, tuple)):
            return all(walk(v) for v in node)
        if isinstance(node, dict):
            return all(walk(v) for v in node.values())
        return True

    return walk(cfg)


class _open:
    """Temporarily lift struct mode (to drop Hydra's own ``hydra`` node)."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    def __enter__(self):
        OmegaConf.set_struct(self.cfg, False)

    def __exit__(self, *exc):
        OmegaConf.set_struct(self.cfg, True)


def to_container(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (for trackers and the run folder)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


__all__ = ["ConfigSchema", "PPO_SCHEMA", "RM_SCHEMA", "SFT_SCHEMA", "get_config", "to_ppo_config", "to_typed_config",
           "check_override_keys", "unknown_key_message", "to_container", "ListConfig"]
