"""The studio's form is the config: every leaf, its type, default, docstring and choices."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from hybrid_rl.algorithms import register_adv_est, registered_adv_estimators, unregister_adv_est
from hybrid_rl.studio.schema import BEGINNER_KEYS, CHOICE_SOURCES, FieldSpec, config_schema, field_docs
from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.loader import get_config


def _leaf_keys(node, prefix=""):
    keys = set()
    for key, value in node.items():
        # free-form dicts are one field each (YAML in the form): override_config, the teachers by name
        if isinstance(value, dict) and value and not key.endswith(("override_config", "teacher_models")):
            keys |= _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.add(prefix + key)
    return keys


def test_every_config_leaf_is_a_field_once_with_its_docstring():
    fields, groups = config_schema()
    keys = [f.key for f in fields]
    assert len(keys) == len(set(keys))
    schema = OmegaConf.to_container(OmegaConf.structured(PPOConfig), resolve=False)
    assert set(keys) == _leaf_keys(schema)
    assert all(f.doc for f in fields), [f.key for f in fields if not f.doc]
    assert {g.key for g in groups} >= {"data", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.optim"}
    assert all(g.doc for g in groups)


def test_defaults_are_the_composed_yamls_and_kinds_follow_the_annotations():
    fields = {f.key: f for f in config_schema()[0]}
    composed = OmegaConf.to_container(get_config(), resolve=False)
    assert fields["data.train_batch_size"] == FieldSpec(
        key="data.train_batch_size", kind="int", optional=False, default=composed["data"]["train_batch_size"],
        doc=field_docs(type(PPOConfig().data))["train_batch_size"], bounds=fields["data.train_batch_size"].bounds)
    assert fields["critic.model.path"].default == "${actor_rollout_ref.model.path}"  # as the YAML writes it
    assert (fields["actor_rollout_ref.actor.grad_clip"].kind, fields["actor_rollout_ref.actor.grad_clip"].optional) == ("float", True)
    assert fields["actor_rollout_ref.actor.optim.betas"].kind == "list"
    assert fields["trainer.single_process"].kind == "bool" and fields["trainer.single_process"].optional
    assert fields["data.train_files"].kind == "any"
    assert fields["actor_rollout_ref.model.override_config"].kind == "dict"


def test_inherited_fields_get_the_base_classes_docstrings():
    critic_model = type(PPOConfig().critic.model)
    base = critic_model.__mro__[1]
    assert dataclasses.is_dataclass(base)
    assert field_docs(critic_model)["lora_rank"] == field_docs(base)["lora_rank"]
    assert "fsdp_config" in field_docs(critic_model)


def test_choices_come_from_the_registries_including_plugins_registered_later():
    fields = {f.key: f for f in config_schema()[0]}
    assert fields["algorithm.adv_estimator"].choices == tuple(registered_adv_estimators())
    assert "vllm" in fields["actor_rollout_ref.rollout.name"].choices
    name = "studio_test_estimator"
    try:
        register_adv_est(name)(lambda **kw: None)
        assert name in {f.key: f for f in config_schema()[0]}["algorithm.adv_estimator"].choices
    finally:
        unregister_adv_est(name)
    for f in fields.values():
        if f.choices and isinstance(f.default, str):
            assert f.default in f.choices, f.key


@pytest.mark.parametrize("keys", [tuple(CHOICE_SOURCES), BEGINNER_KEYS])
def test_named_keys_exist(keys):
    assert set(keys) <= {f.key for f in config_schema()[0]}


def test_number_fields_carry_the_range_declared_beside_them():
    specs = {f.key: f for f in config_schema()[0]}
    assert specs["data.train_batch_size"].bounds == {"low": 1, "low_open": False, "high": None, "high_open": False,
                                                     "rule": ">= 1"}
    assert specs["actor_rollout_ref.rollout.top_p"].bounds["rule"] == "in (0, 1]"
    assert specs["actor_rollout_ref.actor.grad_clip"].bounds["rule"] == "> 0"  # optional: null stays valid
    assert specs["actor_rollout_ref.actor.entropy_coeff"].bounds is None  # no range declared: none shown
    assert all(f.bounds is None for f in specs.values() if f.kind not in ("int", "float"))
    assert sum(f.bounds is not None for f in specs.values()) > 100
