"""check_loss_agg_mode: the one check the nll and value objectives share."""

import pytest

from hybrid_rl.objectives.settings import check_loss_agg_mode
from hybrid_rl.objectives.supervised import NLLConfig
from hybrid_rl.objectives.value import ValueConfig


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_accepts_every_mode(mode):
    check_loss_agg_mode(mode, "x.loss_agg_mode")


def test_names_the_key_and_the_modes():
    expected = ("x.loss_agg_mode='mean' is not a loss aggregation mode; valid: ['token-mean', 'seq-mean-token-sum', "
                "'seq-mean-token-mean', 'seq-mean-token-sum-norm']. Fix: pick one of them.")
    with pytest.raises(ValueError) as caught:
        check_loss_agg_mode("mean", "x.loss_agg_mode")
    assert str(caught.value) == expected


@pytest.mark.parametrize("config, key", [(NLLConfig, "actor_rollout_ref.actor.objective.loss_agg_mode"),
                                         (ValueConfig, "critic.loss_agg_mode")])
def test_each_objective_names_its_own_key(config, key):
    with pytest.raises(ValueError, match=rf"^{key}='sum' is not a loss aggregation mode"):
        config(loss_agg_mode="sum")


def test_an_objective_built_without_config_gets_its_configs_defaults():
    from hybrid_rl.objectives.base import Objective

    class _WithSettings(Objective):
        Config = NLLConfig

    class _WithoutSettings(Objective):
        pass

    assert _WithSettings().config == NLLConfig() and _WithSettings(None).config is not _WithSettings(None).config
    given = NLLConfig(loss_agg_mode="seq-mean-token-sum")
    assert _WithSettings(given).config is given
    assert _WithoutSettings().config is None
