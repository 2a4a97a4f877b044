"""The studio's values: the CLI's checks, per key; YAML and command line out and back in."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from hybrid_rl.studio.form import (FORM_LEVEL, changed_values, check_values, command_line, format_value,
                                   parse_command_line, parse_overrides, to_overrides, to_yaml, values_from_yaml)
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config

VALUES = {
    "trainer.logger": ["console", "jsonl"],
    "data.max_response_length": 64,
    "trainer.experiment_name": "my run: 'quoted', with commas",
    "actor_rollout_ref.actor.optim.betas": [0.9, 0.95],
    "actor_rollout_ref.actor.grad_clip": None,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.model.override_config": {"attention_dropout": 0.0},
    "data.arithmetic.ops": ["+", "-"],
    "actor_rollout_ref.actor.optim.lr": 3e-6,
}


@pytest.mark.parametrize("value, text", [(None, "null"), (True, "true"), (1e-06, "1e-06"), (4, "4"),
                                         ("sdpa", "sdpa"), ("null", "'null'"), ("a b", "'a b'"),
                                         ([1, "x y"], "[1,'x y']"), ({"k": 1}, "{k:1}"),
                                         ("a\\b c", "'a\\b c'"), ("end\\ ", "'end\\ '"),
                                         ("it's\\", "'it\\'s\\\\'")])
def test_values_are_written_in_hydras_grammar(value, text):
    assert format_value(value) == text
    assert parse_overrides([f"k={text}"]) == {"k": value}


def test_the_command_line_round_trips_and_configures_what_the_overrides_do():
    line = command_line(VALUES)
    assert line.startswith("python -m hybrid_rl.trainer.main_ppo ")
    assert parse_command_line(line) == VALUES
    assert parse_command_line(line.split(" ", 3)[3]) == VALUES  # the overrides alone
    assert check_values(VALUES) == {}


def test_the_yaml_round_trips_and_main_ppo_composes_it_to_the_same_config(tmp_path):
    (tmp_path / "my_run.yaml").write_text(to_yaml(VALUES))
    assert values_from_yaml((tmp_path / "my_run.yaml").read_text()) == changed_values(VALUES)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):  # --config-path/--config-name
        from_file = to_ppo_config(compose(config_name="my_run"))
    assert from_file == to_ppo_config(get_config(to_overrides(VALUES)))


def test_only_values_that_differ_from_the_defaults_are_kept():
    assert changed_values({"data.train_batch_size": get_config().data.train_batch_size, "data.shuffle": False}) == \
        ({"data.shuffle": False} if get_config().data.shuffle else {"data.shuffle": False})
    assert to_overrides(changed_values({"actor_rollout_ref.actor.optim.lr": get_config().actor_rollout_ref.actor.optim.lr})) == []


@pytest.mark.parametrize("values, key, words", [
    ({"actor_rollout_ref.actor.optim.lr": "abc"}, "actor_rollout_ref.actor.optim.lr", "could not be converted to Float"),
    ({"actor_rollout_ref.rollout.name": "foo"}, "actor_rollout_ref.rollout.name", "must be one of"),
    ({"algorithm.adv_estimator": "grpoo"}, "algorithm.adv_estimator", "not registered"),
    ({"data.train_files": "/no/such/file.parquet"}, "data.train_files", "does not exist"),
    ({"data.train_batch_size": 7, "actor_rollout_ref.actor.ppo_mini_batch_size": 4},
     "actor_rollout_ref.actor.ppo_mini_batch_size", "multiple of"),
    # outside a declared range: a section's own check (key relative to it) and validate_config's pass
    ({"actor_rollout_ref.rollout.top_p": 0}, "actor_rollout_ref.rollout.top_p", "must be in (0, 1]"),
    ({"algorithm.gamma": 1.5}, "algorithm.gamma", "must be in [0, 1]"),
])
def test_a_bad_value_gets_the_clis_one_line_message_beside_its_key(values, key, words):
    errors = check_values(values)
    assert list(errors) == [key] and words in errors[key]
    assert "\n" not in errors[key]


def test_a_value_that_cannot_be_written_is_a_form_level_message_not_a_crash():
    with pytest.raises(ValueError, match="cannot be written as a config value"):
        format_value(object())
    errors = check_values({"data.unknown_key": 1})
    assert list(errors) == [FORM_LEVEL] and "Unknown config key 'data.unknown_key'" in errors[FORM_LEVEL]


def test_a_bad_yaml_or_command_line_is_one_line():
    with pytest.raises(ValueError, match="must be a mapping"):
        values_from_yaml("- a\n- b\n")
    with pytest.raises(ValueError, match="cannot parse"):
        parse_overrides(["data.train_batch_size=[1"])
    with pytest.raises(ValueError, match="is a sweep"):
        parse_overrides(["trainer.logger=console,jsonl"])


def test_a_message_naming_a_key_in_full_goes_to_that_key_not_to_an_edited_look_alike():
    errors = check_values({"critic.model.path": "/no/such/model", "actor_rollout_ref.model.path": "/no/such/model"})
    assert all(key in message for key, message in errors.items() if key)
