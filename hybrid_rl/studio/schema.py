"""The studio's form, derived from the config itself: every leaf of :class:`PPOConfig` as a field spec.

Nothing here lists fields by hand. The walk goes over the dataclasses (types from their annotations),
takes each field's docstring from the source (:func:`hybrid_rl.trainer.config.docs.field_docs`: the
string literal under the field, read with :mod:`ast`), and takes the default from the composed
config, which is what a run without overrides gets (an interpolation such as
``${actor_rollout_ref.model.path}`` stays as written). Choices come from the registries and the
tuples the config checks against (:data:`CHOICE_SOURCES`), read when asked, so a plugin registered
before the call shows up.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

from hybrid_rl.studio.fields import human_label, path_role
from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.docs import field_docs
from hybrid_rl.utils.bounds import field_bounds

KINDS = ("bool", "int", "float", "str", "list", "dict", "any")
"""What a field's widget edits: a checkbox, a number, text, or YAML for lists, dicts and ``Any``."""


@dataclass(frozen=True)
class FieldSpec:
    """One leaf of the config, as the form shows it."""

    key: str
    """Dotted path, e.g. ``actor_rollout_ref.actor.optim.lr``."""
    kind: str
    """One of :data:`KINDS`."""
    optional: bool
    """``null`` is a valid value (the annotation is ``Optional``)."""
    default: Any
    """The value a run gets without overrides (the composed YAML's, interpolations unresolved)."""
    doc: str
    """The field's docstring (help text)."""
    choices: Optional[tuple[str, ...]] = None
    """The valid values where the config accepts a fixed set (registries included)."""
    bounds: Optional[dict[str, Any]] = None
    """A number's valid range as declared beside the field (:func:`hybrid_rl.utils.bounds.bounded`):
    ``low``/``high`` (``None`` = open-ended), ``low_open``/``high_open`` and the ``rule`` in words."""

    @property
    def group(self) -> str:
        """The dotted path of the section holding the field (``""`` for none)."""
        return self.key.rpartition(".")[0]

    @property
    def label(self) -> str:
        """A human label derived from the key (:func:`hybrid_rl.studio.fields.human_label`)."""
        return human_label(self.key)

    @property
    def path_role(self) -> Optional[str]:
        """What the field names on disk, if anything (:func:`hybrid_rl.studio.fields.path_role`)."""
        return path_role(self.key) if self.kind in ("str", "any", "list") else None


@dataclass(frozen=True)
class GroupSpec:
    """A section of the config (a nested dataclass), as the YAML nests it."""

    key: str
    """Dotted path, e.g. ``actor_rollout_ref.rollout``."""
    doc: str
    """The docstring of the field that holds the section."""


def _choices_of(name: str) -> Callable[[], tuple[str, ...]]:
    """A source of choices read at call time from a public ``"module:NAME"``: a function returning the
    names (a registry's ``registered_*``, so user registrations count) or a tuple of names."""
    def read() -> tuple[str, ...]:
        module, _, attribute = name.partition(":")
        value = getattr(__import__(module, fromlist=[attribute]), attribute)
        return tuple(value() if callable(value) else value)
    return read


CHOICE_SOURCES: dict[str, Callable[[], tuple[str, ...]]] = {
    "algorithm.adv_estimator": _choices_of("hybrid_rl.algorithms:registered_adv_estimators"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": _choices_of("hybrid_rl.algorithms:registered_policy_losses"),
    "actor_rollout_ref.actor.loss_agg_mode": _choices_of("hybrid_rl.algorithms.loss_agg:LOSS_AGG_MODES"),
    "actor_rollout_ref.actor.kl_loss_type": _choices_of("hybrid_rl.algorithms.kl:KL_PENALTY_TYPES"),
    "algorithm.kl_penalty": _choices_of("hybrid_rl.algorithms.kl:KL_PENALTY_TYPES"),
    "distillation.distillation_loss.loss_mode": _choices_of(
        "hybrid_rl.algorithms.distillation:registered_distillation_losses"),
    "actor_rollout_ref.model.attn_implementation": _choices_of("hybrid_rl.workers.config:ATTN_IMPLEMENTATIONS"),
    "critic.model.attn_implementation": _choices_of("hybrid_rl.workers.config:ATTN_IMPLEMENTATIONS"),
    "actor_rollout_ref.rollout.name": _choices_of("hybrid_rl.workers.rollout.config:ROLLOUT_NAMES"),
    "actor_rollout_ref.rollout.mode": _choices_of("hybrid_rl.workers.rollout.config:ROLLOUT_MODES"),
    "actor_rollout_ref.rollout.load_format": _choices_of("hybrid_rl.workers.rollout.config:LOAD_FORMATS"),
    "actor_rollout_ref.rollout.dtype": _choices_of("hybrid_rl.workers.rollout.config:ROLLOUT_DTYPES"),
    "reward_model.reward_manager": _choices_of("hybrid_rl.reward:registered_reward_managers"),
    "trainer.cpu_allocator": _choices_of("hybrid_rl.utils.cpu_env:CPU_ALLOCATORS"),
    "async_training.buffer.storage_type": _choices_of("hybrid_rl.buffer.base:BUFFER_STORAGE_TYPES"),
}
"""Config keys whose valid values are a fixed set, and where that set lives (read at call time)."""


def _kind(annotation: Any) -> tuple[str, bool]:
    """``(kind, optional)`` of a field annotation."""
    optional = False
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else Any
    origin = typing.get_origin(annotation) or annotation
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}
    return names.get(origin, "any"), optional


def _get(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


@lru_cache(maxsize=1)
def yaml_defaults() -> dict[str, Any]:
    """The composed ``ppo_trainer.yaml`` without overrides, interpolations unresolved (plain dict)."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.loader import get_config

    tree = OmegaConf.to_container(get_config(), resolve=False)
    tree.pop("hydra", None)
    return tree


def _walk(cls: type, prefix: str, fields: list[FieldSpec], groups: list[GroupSpec]) -> None:
    hints, docs, defaults = typing.get_type_hints(cls), field_docs(cls), yaml_defaults()
    for f in dataclasses.fields(cls):
        key, annotation = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(annotation):
            groups.append(GroupSpec(key=key, doc=docs.get(f.name, "")))
            _walk(annotation, key + ".", fields, groups)
            continue
        kind, optional = _kind(annotation)
        source, bounds = CHOICE_SOURCES.get(key), field_bounds(f)
        fields.append(FieldSpec(key=key, kind=kind, optional=optional, default=_get(defaults, key),
                                doc=docs.get(f.name, ""), choices=source() if source else None,
                                bounds=bounds.as_json() if bounds else None))


def config_schema() -> tuple[list[FieldSpec], list[GroupSpec]]:
    """Every leaf and every section of :class:`PPOConfig`, in the dataclasses' (= the YAML's) order."""
    fields: list[FieldSpec] = []
    groups: list[GroupSpec] = []
    _walk(PPOConfig, "", fields, groups)
    return fields, groups


BEGINNER_KEYS = (
    "actor_rollout_ref.model.path",
    "data.train_files",
    "data.val_files",
    "algorithm.adv_estimator",
    "data.train_batch_size",
    "actor_rollout_ref.rollout.n",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.actor.optim.lr",
    "trainer.total_training_steps",
    "trainer.logger",
)
"""The handful of keys a first run needs (the beginner view); every key is in the expert view."""
