"""``actor_rollout_ref.actor.objective``: empty = PPO's terms from veRL's keys; ``{name, settings}``
trains that objective; a wrong name, setting or value is one line at config time and through main_ppo."""

import pytest

from hybrid_rl.objectives.base import WeightedSum
from hybrid_rl.objectives.preference import DPOObjective
from hybrid_rl.objectives.supervised import NLLObjective
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.workers.config import ActorConfig
from hybrid_rl.workers.objective_choice import actor_objective

KEY = "actor_rollout_ref.actor.objective"


def test_an_empty_objective_is_ppos_terms_from_verls_keys():
    objective = actor_objective(ActorConfig(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.2))
    assert isinstance(objective, WeightedSum)
    assert [(term.name, weight) for term, weight in objective.terms] == [
        ("policy_loss", 1.0), ("entropy", -0.01), ("kl_loss", 0.2)]


def test_a_named_objective_takes_its_settings_and_the_actors_loss_agg_mode():
    nll = actor_objective(ActorConfig(objective={"name": "nll"}, loss_agg_mode="seq-mean-token-sum"))
    assert isinstance(nll, NLLObjective) and nll.config.loss_agg_mode == "seq-mean-token-sum"
    own = actor_objective(ActorConfig(objective={"name": "nll", "loss_agg_mode": "token-mean"},
                                      loss_agg_mode="seq-mean-token-sum"))
    assert own.config.loss_agg_mode == "token-mean"  # given: kept
    dpo = actor_objective(ActorConfig(objective={"name": "dpo", "beta": 0.3}))
    assert isinstance(dpo, DPOObjective) and dpo.config.beta == 0.3


@pytest.mark.parametrize("section, line", [
    ({"name": "nope"}, f"unknown objective 'nope' ({KEY}.name); registered: ["),
    ({"name": "nll", "beta": 0.1}, f"{KEY}.beta is not a setting of the nll objective; valid: ['loss_agg_mode']. "
                                   "Fix: spell it as one of them or remove it."),
    ({"name": "nll", "loss_agg_mode": "mean"}, f"{KEY}.loss_agg_mode='mean' is not a loss aggregation mode; valid: "),
    ({"beta": 0.1}, f"{KEY}.name is missing (the section holds ['beta']). Fix: set {KEY}.name to one of ["),
])
def test_a_wrong_objective_is_one_line_at_config_time(section, line):
    with pytest.raises(ValueError) as error:
        ActorConfig(objective=section)
    message = str(error.value)
    assert message.startswith(line) and "\n" not in message


def test_an_objective_other_than_ppos_refuses_distillation():
    with pytest.raises(ValueError, match=rf"^{KEY}.name=nll replaces PPO's loss, so distillation.enabled=true"):
        actor_objective(ActorConfig(objective={"name": "nll"}), distillation=object())


@pytest.mark.parametrize("override", [f"{KEY}={{name:nll,loss_agg_mode:seq-mean-token-mean}}",
                                      f"+{KEY}.name=nll", f"{KEY}.name=nll"])
def test_the_command_line_sets_the_objective(override):
    extra = [f"{KEY}.loss_agg_mode=seq-mean-token-mean"] if "{" not in override else []
    actor = to_ppo_config(get_config([override, *extra])).actor_rollout_ref.actor
    assert actor.objective == {"name": "nll", "loss_agg_mode": "seq-mean-token-mean"}
    assert actor.policy_loss.loss_mode == "vanilla"  # veRL's keys keep their values


@pytest.mark.parametrize("override, line", [
    (f"{KEY}={{name:nope}}", f"hybrid_rl config error: unknown objective 'nope' ({KEY}.name); registered: ["),
    (f"+{KEY}.name=dpo", None),
    (f"{KEY}.beta=0.1", f"hybrid_rl config error: {KEY}.name is missing (the section holds ['beta'])."),
])
def test_main_ppo_ends_a_wrong_objective_in_one_line(override, line, monkeypatch, capsys, tmp_path):
    from hybrid_rl.trainer import main_ppo

    monkeypatch.chdir(tmp_path)
    overrides = [override] + ([f"{KEY}.betta=0.1"] if line is None else [])
    line = line or (f"hybrid_rl config error: {KEY}.betta is not a setting of the dpo objective; valid: ['beta', ")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main_ppo.main(overrides)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2
    assert err[-1].startswith(line), err[-1]
    assert "Traceback" not in "\n".join(err)
