"""Declared ranges (hybrid_rl.utils.bounds): the interval arithmetic, the messages, and that every range
declared on the configs is refused outside by the command line's checks, under its key."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Optional

import pytest

from hybrid_rl.trainer.config.checks import validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config, to_typed_config
from hybrid_rl.trainer.config.schema import key_owner
from hybrid_rl.trainer.config.supervised import RMConfig, SFTConfig
from hybrid_rl.utils.bounds import Bounds, bound_problems, bounded, check_bounds, field_bounds


@dataclass
class _Inner:
    share: float = bounded(0.5, gt=0, le=1, fix="use e.g. 0.5")
    cap: Optional[int] = bounded(None, ge=2)
    floor: float = bounded(1.0, ge=0)
    weight: float = 1.0


@dataclass
class _Outer:
    epochs: int = bounded(1, ge=1)
    plain: int = -5
    inner: _Inner = field(default_factory=_Inner)


@pytest.mark.parametrize("bounds, inside, outside, rule", [
    (Bounds(low=1), [1, 2, 1e9], [0, 0.999, -1], ">= 1"),
    (Bounds(low=0, low_open=True), [1e-12, 3], [0, -1], "> 0"),
    (Bounds(low=0, low_open=True, high=1), [1, 0.5], [0, 1.0001], "in (0, 1]"),
    (Bounds(low=0, high=1, high_open=True), [0, 0.999], [1, -0.1], "in [0, 1)"),
    (Bounds(high=2.5), [-7, 2.5], [2.6], "<= 2.5"),
    (Bounds(low=-1), [-1, 0, 5], [-2, float("nan"), float("inf")], ">= -1"),
    (Bounds(low=0, high=1), [0.5], [float("nan"), float("inf")], "in [0, 1]"),
    (Bounds(), [-1e300, 0, 1e300], [float("nan"), float("inf"), float("-inf")], "any finite number"),
])
def test_intervals_and_their_rule(bounds, inside, outside, rule):
    assert all(bounds.holds(v) for v in inside) and not any(bounds.holds(v) for v in outside)
    assert bounds.rule == rule
    assert bounds.as_json()["rule"] == rule


def test_bounded_declares_on_the_field_and_refuses_two_lower_ends():
    share = next(f for f in dataclasses.fields(_Inner) if f.name == "share")
    assert field_bounds(share) == Bounds(low=0, low_open=True, high=1, fix="use e.g. 0.5")
    assert _Inner().share == 0.5
    with pytest.raises(TypeError, match="at most one of ge/gt"):
        bounded(1, ge=0, gt=0)


def test_check_bounds_raises_the_house_line():
    check_bounds(_Inner(), "x")  # defaults pass, null passes an Optional field
    with pytest.raises(ValueError, match=r"^x.share=0 is invalid: must be in \(0, 1\]. Fix: use e.g. 0.5.$"):
        check_bounds(_Inner(share=0), "x")
    with pytest.raises(ValueError, match=r"^x.cap=1 is invalid: must be >= 2 or null. Fix: use a value >= 2.$"):
        check_bounds(_Inner(cap=1), "x")
    with pytest.raises(ValueError, match=r"^x.share=nan is invalid: must be a finite number in \(0, 1\]"):
        check_bounds(_Inner(share=float("nan")), "x")  # a comparison with NaN is false: refused, not passed
    with pytest.raises(ValueError, match=r"^x.floor=inf is invalid: must be a finite number >= 0. Fix: "):
        check_bounds(_Inner(floor=float("inf")), "x")  # open-ended above, but infinity is no number to train with
    with pytest.raises(ValueError, match=r"^x.weight=-inf is invalid: must be a finite number. Fix: use a finite"):
        check_bounds(_Inner(weight=float("-inf")), "x")  # a float field that declares no range: finite
    check_bounds(_Inner(weight=-1e300), "x")
    for not_a_number in ("3", True, [3]):
        with pytest.raises(ValueError, match=r"x.share=.* is invalid: must be a number in \(0, 1\]"):
            check_bounds(_Inner(share=not_a_number), "x")


def test_bound_problems_walks_the_tree_in_order_with_dotted_keys():
    assert bound_problems(_Outer()) == []
    bad = _Outer(epochs=0, inner=_Inner(share=2.0, cap=0))
    assert [line.split("=")[0] for line in bound_problems(bad)] == ["epochs", "inner.share", "inner.cap"]
    assert bound_problems(bad, "run.")[0].startswith("run.epochs=0 is invalid: must be >= 1.")


def test_every_mode_s_defaults_lie_in_their_ranges():
    assert bound_problems(to_ppo_config(get_config())) == []
    for cls in (SFTConfig, RMConfig):  # resolved as their trainers resolve them (linked keys followed)
        assert bound_problems(to_typed_config(cls(), cls)) == []


def _outside(bounds: Bounds, kind: type) -> float:
    """A value just outside ``bounds`` (below the lower end where there is one)."""
    if bounds.low is not None:
        return bounds.low if bounds.low_open else bounds.low - (1 if kind is int else 0.5)
    return bounds.high if bounds.high_open else bounds.high + 1


def _bounded_keys(cfg, prefix=""):
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _bounded_keys(value, f"{prefix}{f.name}.")
        elif field_bounds(f) is not None:
            yield prefix + f.name, field_bounds(f)


def _with(cfg, key: str, value):
    """``cfg`` with ``key`` set: each section on the path rebuilt, so its own checks run."""
    head, _, rest = key.partition(".")
    new = value if not rest else _with(getattr(cfg, head), rest, value)
    return dataclasses.replace(cfg, **{head: new})


def _validators():
    """``(mode, resolved default config, its validation)`` of every mode."""
    from hybrid_rl.trainer.config.supervised_checks import validate_rm_config, validate_sft_config
    from hybrid_rl.trainer.main_rm import rm_config
    from hybrid_rl.trainer.main_sft import sft_config

    return [("ppo", to_ppo_config(get_config()), validate_config),
            ("sft", to_typed_config(sft_config(), SFTConfig), validate_sft_config),
            ("rm", to_typed_config(rm_config(), RMConfig), validate_rm_config)]


@pytest.mark.parametrize("mode", ["ppo", "sft", "rm"])
def test_every_declared_range_is_refused_outside_under_its_key(mode):
    """Exhaustive per mode: a value just outside a field's range is one line naming the field, from
    the section's own checks (a notebook building it) or from the mode's validation (the CLI's pass)."""
    _, base, validate = next(v for v in _validators() if v[0] == mode)
    keys = list(_bounded_keys(base))
    assert len(keys) > (100 if mode == "ppo" else 10)
    for key, bounds in keys:
        owner, leaf = key_owner(base, key)
        kind = type(getattr(owner, leaf)) if getattr(owner, leaf) is not None else float
        value = _outside(bounds, int if kind is int else float)
        try:
            validate(_with(base, key, value))
        except ValueError as error:
            assert f".{leaf}={value!r} is invalid: must be " in str(error) or \
                f"{key}={value!r} is invalid: must be " in str(error), (key, str(error))
        else:
            pytest.fail(f"{key}={value} passed its declared range {bounds.rule}")


def _float_keys(cfg, prefix=""):
    """Every ``float`` / ``Optional[float]`` field of the tree, declared range or not."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _float_keys(value, f"{prefix}{f.name}.")
        elif hints[f.name] in (float, Optional[float]):
            yield prefix + f.name


@pytest.mark.parametrize("mode", ["ppo", "sft", "rm"])
def test_every_float_key_refuses_nan_and_infinity_under_its_key(mode):
    """Exhaustive per mode: NaN, inf and -inf lie in no range (an ``optim.lr=inf`` would ruin the
    weights at the first step), also where a float key declares none."""
    _, base, validate = next(v for v in _validators() if v[0] == mode)
    keys = list(_float_keys(base))
    assert len(keys) > (40 if mode == "ppo" else 5) and any(k.endswith("optim.lr") for k in keys)
    for key in keys:
        leaf = key.rpartition(".")[2]
        for value in (float("inf"), float("-inf"), float("nan")):
            try:
                validate(_with(base, key, value))
            except ValueError as error:
                assert f"{leaf}={value!r} is invalid: must be a finite number" in str(error), (key, str(error))
            else:
                pytest.fail(f"{key}={value} passed")


@pytest.mark.parametrize("mode, overrides, key", [
    ("ppo", ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=-4"],
     "reward_model.overlong_buffer.len"),
    ("ppo", ["distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/m",
             "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=0"],
     "distillation.distillation_loss.topk"),
    ("sft", ["data.max_token_len_per_gpu=0"], "data.max_token_len_per_gpu"),
])
def test_a_value_outside_its_range_is_told_once_not_again_by_a_cross_field_rule(mode, overrides, key):
    from hybrid_rl.trainer.config.supervised_checks import validate_sft_config
    from hybrid_rl.trainer.main_sft import sft_config

    with pytest.raises(ValueError) as error:
        if mode == "sft":
            validate_sft_config(sft_config(overrides))
        else:
            validate_config(to_ppo_config(get_config(overrides)))
    lines = [line for line in str(error.value).splitlines() if f"{key}=" in line]
    assert len(lines) == 1 and "is invalid: must be" in lines[0], str(error.value)
