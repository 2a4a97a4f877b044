"""Hydra composition of ``config/ppo_trainer.yaml`` over the typed :class:`PPOConfig` schema.

The dataclass is registered as the Hydra schema ``ppo_trainer_schema``; the YAML lists it first in
its defaults, so every key of the YAML and of the command line must exist in the dataclasses and
have the right type. Before Hydra runs, :func:`check_override_keys` turns a misspelt key into a
one-line error that names the nearest valid key (Hydra's own message does not).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any, Iterable, Union

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybrid_rl.trainer.config import PPOConfig

# The YAML sits in this package, beside the dataclasses (schema.py).
CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_NAME = "ppo_trainer"
SCHEMA_NAME = "ppo_trainer_schema"

ConfigStore.instance().store(name=SCHEMA_NAME, node=PPOConfig)


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


def unknown_key_message(key: str, valid: Iterable[str]) -> str:
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
        "python -m hybrid_rl.trainer.main_ppo --help (documented in hybrid_rl/trainer/config/schema.py)."
    )


def check_override_keys(overrides: list[str]) -> None:
    """Raise ValueError for the first override whose key is not in the schema."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    valid, open_dicts = _valid_keys(OmegaConf.structured(PPOConfig))
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
        raise ValueError(unknown_key_message(key, valid))


def get_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the trainer config like ``python -m hybrid_rl.trainer.main_ppo <overrides>``.

    Returns a typed DictConfig (assigning an unknown key or a wrong type raises). Pass it to
    :func:`hybrid_rl.trainer.run_ppo` or :func:`to_ppo_config`.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides or [])
    check_override_keys(overrides)
    if GlobalHydra.instance().is_initialized():
        # Inside a Hydra app (or a notebook that used hydra before): compose in a fresh context.
        GlobalHydra.instance().clear()
    from hydra.errors import ConfigCompositionException

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:
            cfg = compose(config_name=CONFIG_NAME, overrides=overrides)
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
    if isinstance(cfg, PPOConfig):
        return cfg if _is_resolved(cfg) else OmegaConf.to_object(OmegaConf.structured(cfg))
    if not isinstance(cfg, DictConfig):
        raise TypeError(f"expected a DictConfig from get_config() or a PPOConfig, got {type(cfg).__name__}")
    cfg = cfg.copy()
    if "hydra" in cfg:
        with _open(cfg):
            cfg.pop("hydra")
    return OmegaConf.to_object(cfg)


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


def to_container(cfg: PPOConfig) -> dict[str, Any]:
    """Plain nested dict of a :class:`PPOConfig` (for trackers and the run folder)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


__all__ = ["get_config", "to_ppo_config", "check_override_keys", "unknown_key_message", "to_container", "ListConfig"]
