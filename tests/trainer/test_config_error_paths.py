"""Nested config sections' one-line errors name the full dotted key (trainer/config/error_paths.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from hybrid_rl.trainer.config.error_paths import (complete_keys, name_the_source, qualified_key, qualify_error,
                                                  qualify_warnings)
from hybrid_rl.trainer.config.loader import (PPO_SCHEMA, RM_SCHEMA, SFT_SCHEMA, get_config, to_ppo_config,
                                             to_typed_config)
from hybrid_rl.trainer.config.schema import PPOConfig
from hybrid_rl.utils.log_setup import ConfigDeprecationWarning


def test_the_keys_a_fix_names_are_completed_from_the_same_start():
    text = " is invalid. Fix: set rollout.do_sample=false, not a.rollout.x or rollouts."
    assert complete_keys(text, "rollout.temperature", "actor_rollout_ref.") == (
        " is invalid. Fix: set actor_rollout_ref.rollout.do_sample=false, not a.rollout.x or rollouts.")
    assert complete_keys(" Fix: use lr.", "lr", "critic.optim.") == " Fix: use lr."


def test_a_relative_key_is_completed_from_its_sections_place():
    assert qualified_key("optim.lr", "critic.optim") == "critic.optim.lr"
    assert qualified_key("fsdp_config.layer_wrap", "actor_rollout_ref.actor.fsdp_config") == \
        "actor_rollout_ref.actor.fsdp_config.layer_wrap"
    assert qualified_key("actor.kl_loss_type", "actor_rollout_ref.actor") == "actor_rollout_ref.actor.kl_loss_type"
    assert qualified_key("lr", "critic.optim", fields=("lr", "betas")) == "critic.optim.lr"  # a field of the section
    assert qualified_key("critic.optim.lr", "critic.optim") == "critic.optim.lr"  # already full
    assert qualified_key("other.key", "critic.optim", fields=("lr",)) == "other.key"  # fits neither way: kept
    assert qualified_key("optim.lr", "") == "optim.lr"


@pytest.mark.parametrize("override, full_key", [
    ("actor_rollout_ref.actor.fsdp_config.layer_wrap=layers", "actor_rollout_ref.actor.fsdp_config.layer_wrap"),
    ("actor_rollout_ref.ref.fsdp_config.layer_wrap=layers", "actor_rollout_ref.ref.fsdp_config.layer_wrap"),
    ("critic.model.fsdp_config.layer_wrap=layers", "critic.model.fsdp_config.layer_wrap"),
    ("critic.model.fsdp_config.mixed_precision.param_dtype=fp8",
     "critic.model.fsdp_config.mixed_precision.param_dtype"),
    ("critic.optim.lr=-1", "critic.optim.lr"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr"),
    ("actor_rollout_ref.rollout.name=foo", "actor_rollout_ref.rollout.name"),
])
def test_the_error_of_a_nested_section_names_the_full_key(override, full_key):
    with pytest.raises(ValueError) as caught:
        to_ppo_config(get_config([override]))
    message = str(caught.value)
    assert message.startswith(f"{full_key}=") and " is invalid: " in message and "Fix: " in message
    assert "\n" not in message


def _non_negative(key: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{key}={value} is invalid: must be >= 0. Fix: use 0.")


@dataclass
class _Inner:
    x: int = 0

    def __post_init__(self):
        _non_negative("x", self.x)


@dataclass
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    y: int = 0

    def __post_init__(self):
        _non_negative("y", self.y)


@dataclass
class _Pool:
    members: dict[str, _Inner] = field(default_factory=dict)
    order: list[_Inner] = field(default_factory=list)


def _error(cfg) -> ValueError:
    with pytest.raises(ValueError) as caught:
        OmegaConf.to_object(cfg)
    return caught.value


def test_a_sections_own_field_is_prefixed_and_root_errors_are_kept():
    nested = OmegaConf.structured(_Outer)
    nested.inner.x = -1
    assert str(qualify_error(nested, _error(nested))) == "inner.x=-1 is invalid: must be >= 0. Fix: use 0."
    root = OmegaConf.structured(_Outer)
    root.y = -2
    error = _error(root)
    assert qualify_error(root, error) is error
    other = ValueError("something else went wrong")
    assert qualify_error(root, other) is other


@pytest.mark.parametrize("schema, prefix", [("ppo", "actor_rollout_ref.rollout"), ("sft", "rollout")])
def test_the_agent_sections_are_named_where_each_entry_point_has_them(schema, prefix):
    chosen = {"ppo": PPO_SCHEMA, "sft": SFT_SCHEMA}[schema]
    for key, value in (("multi_turn.format", "foo"), ("agent.batch_window_s", "-1"),
                       ("multi_turn.tool_config_path", "t.yaml")):
        with pytest.raises(ValueError) as caught:
            to_typed_config(get_config([f"{prefix}.{key}={value}"], chosen), chosen.node)
        message = str(caught.value)
        assert message.startswith(f"{prefix}.") and f".{key.split('.')[0]}." in message, message
    assert f"Fix: set {prefix}.multi_turn.enable=true" in message  # the fix's own key completed too


def test_the_other_entry_points_name_full_keys_too():
    with pytest.raises(ValueError, match=r"^model\.fsdp_config\.layer_wrap='layers' is invalid"):
        to_typed_config(get_config(["model.fsdp_config.layer_wrap=layers"], RM_SCHEMA), RM_SCHEMA.node)


def test_sections_under_a_mapping_or_a_list_are_found_with_their_name():
    pool = OmegaConf.structured(_Pool)
    pool.members["t"] = OmegaConf.structured(_Inner)
    pool.members.t.x = -1
    assert str(qualify_error(pool, _error(pool))).startswith("members.t.x=-1 is invalid")
    listed = OmegaConf.structured(_Pool)
    listed.order.append(OmegaConf.structured(_Inner))
    listed.order.append(OmegaConf.structured(_Inner))
    listed.order[1].x = -3
    assert str(qualify_error(listed, _error(listed))).startswith("order.1.x=-3 is invalid")


@pytest.mark.parametrize("schema", [PPO_SCHEMA, SFT_SCHEMA])
def test_a_bad_value_a_linked_key_follows_is_blamed_on_the_key_that_was_set(schema):
    with pytest.raises(ValueError) as caught:
        to_typed_config(get_config(["data.max_prompt_length=-999"], schema), schema.node)
    follower = "actor_rollout_ref.rollout.prompt_length" if schema is PPO_SCHEMA else "rollout.prompt_length"
    assert str(caught.value) == (f"data.max_prompt_length=-999 is invalid: must be >= 1 ({follower} follows it). "
                                 "Fix: set data.max_prompt_length to a positive integer.")


def test_a_linked_key_set_itself_keeps_its_own_name():
    with pytest.raises(ValueError) as caught:
        to_ppo_config(get_config(["actor_rollout_ref.rollout.prompt_length=-5"]))
    assert str(caught.value).startswith("actor_rollout_ref.rollout.prompt_length=-5 is invalid: must be >= 1. Fix:")


@dataclass
class _Chain:
    a: int = 1
    b: int = "${a}"  # type: ignore[assignment]
    c: int = "${b}"  # type: ignore[assignment]
    d: int = "${oc.env:HOME}"  # type: ignore[assignment] - not a plain key: names no source


def test_the_source_is_followed_to_the_end_of_a_chain_of_links():
    chain = OmegaConf.structured(_Chain)
    assert name_the_source(chain, "c=-1 is invalid: must be >= 0. Fix: use c=0.") == \
        "a=-1 is invalid: must be >= 0 (c follows it). Fix: use a=0."
    assert name_the_source(chain, "c=-1 is invalid") == "a=-1 is invalid (c follows it)."
    for kept in ("a=-1 is invalid: x. Fix: y.", "d=-1 is invalid: x.", "nothing=1 is invalid.", "no key here"):
        assert name_the_source(chain, kept) == kept


def test_a_python_built_config_names_full_keys_too():
    cfg = PPOConfig()
    cfg.actor_rollout_ref.ref.fsdp_config.layer_wrap = "layers"
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.ref\.fsdp_config\.layer_wrap='layers' is invalid"):
        to_ppo_config(cfg)


def test_deprecation_notices_name_full_keys_once_per_section_and_point_at_the_caller():
    overrides = ["actor_rollout_ref.actor.ppo_micro_batch_size=4", "critic.optim.warmup_style=constant",
                 "actor_rollout_ref.actor.optim.warmup_style=cosine"]
    with pytest.warns(ConfigDeprecationWarning) as caught:
        to_ppo_config(get_config(overrides))
    texts = [str(w.message) for w in caught]
    assert sorted(t.split(" ")[0] for t in texts) == ["actor_rollout_ref.actor.optim.warmup_style",
                                                      "actor_rollout_ref.actor.ppo_micro_batch_size",
                                                      "critic.optim.warmup_style"]
    assert "use critic.optim.lr_scheduler_type" in next(t for t in texts if t.startswith("critic."))
    assert {w.filename for w in caught} == {__file__}


def test_a_notice_no_section_gives_alone_is_kept():
    cfg = OmegaConf.structured(_Outer)
    assert qualify_warnings(cfg, ["x is deprecated", "x is deprecated", "free text"]) == \
        ["x is deprecated", "free text"]


def test_notices_given_before_a_failing_conversion_still_come_out():
    with pytest.warns(ConfigDeprecationWarning, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size is"):
        with pytest.raises(ValueError, match=r"^data\.max_response_length=-1 is invalid"):
            to_ppo_config(get_config(["actor_rollout_ref.actor.ppo_micro_batch_size=2",
                                      "data.max_response_length=-1"]))


@dataclass
class _Noisy:
    x: int = 0

    def __post_init__(self):
        import warnings

        warnings.warn("a section's own remark", UserWarning)


def test_other_warnings_of_a_conversion_keep_their_place():
    with pytest.warns(UserWarning, match="a section's own remark") as caught:
        to_typed_config(OmegaConf.structured(_Noisy), _Noisy)
    assert [w.filename for w in caught] == [__file__] and len(caught) == 1


def test_cfg_job_prints_the_notices_hydra_would_not(capsys, monkeypatch):
    from hybrid_rl.trainer import main_ppo

    monkeypatch.setattr("sys.argv", ["main_ppo"])  # main(argv) sets it
    main_ppo.main(["critic.optim.warmup_style=constant", "--cfg", "job"])
    out, err = capsys.readouterr()
    assert "warmup_style: constant" in out
    assert err.splitlines()[0].startswith("critic.optim.warmup_style is deprecated"), err
