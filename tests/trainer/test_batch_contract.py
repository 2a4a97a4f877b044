"""The batch contract: each step declares its keys; a plan whose step needs a key nothing makes is
refused at start-up in one line; with check_batch the batch is checked at every step boundary."""

import dataclasses

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.core.batch_contract import (CHECK_BATCH_ENV, BatchPlan, StepContract, check_after,
                                                   check_batch_enabled, check_before)
from hybrid_rl.trainer.ppo import contracts as ppo_contracts
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from hybrid_rl.trainer.rm.contracts import rm_batch_plan
from hybrid_rl.trainer.sft.contracts import sft_batch_plan
from tests.trainer.test_core import SumMode, _cfg

DATASET = StepContract("dataset collate", writes=("input_ids",))


def _plan(*steps):
    return BatchPlan(DATASET, tuple(steps), "tests/trainer/test_batch_contract.py")


def test_a_step_reading_what_nothing_makes_is_refused_in_one_line():
    plan = _plan(StepContract("generate", ("input_ids",), writes=("responses",)),
                 StepContract("update_actor", ("responses", "ref_log_prob")))
    with pytest.raises(ValueError) as error:
        plan.check()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("step update_actor needs batch key 'ref_log_prob' that no earlier step produces "
                              "(steps: generate -> update_actor; dataset collate writes ['input_ids']). Fix: ")
    assert "ref compute_ref_log_prob" in message  # what the schema says makes it


def test_a_key_written_too_late_names_the_later_step():
    plan = _plan(StepContract("compute_advantage", ("values",), writes=("advantages",)),
                 StepContract("compute_values", ("input_ids",), writes=("values",)))
    with pytest.raises(ValueError, match="compute_values writes it but runs later"):
        plan.check()
    _plan(StepContract("compute_values", ("input_ids",), writes=("values",)),
          StepContract("compute_advantage", ("values",), writes=("advantages",))).check()  # in order: fine


def test_a_declared_key_outside_the_schema_is_refused():
    with pytest.raises(ValueError, match="step generate declares batch key 'respones', which is not in the batch schema"):
        _plan(StepContract("generate", ("input_ids",), writes=("respones",))).check()


def _batch(**tensors):
    return DataProto.from_dict({k: torch.zeros(2, 3) for k in tensors} or {"input_ids": torch.zeros(2, 3)})


def test_the_step_boundaries_name_the_step():
    plan = _plan(StepContract("generate", ("input_ids",), writes=("responses",)))
    check_before(plan, "generate", _batch(input_ids=1))
    with pytest.raises(ValueError, match=r"step generate: batch is missing batch\['input_ids'\]"):
        check_before(plan, "generate", _batch(responses=1))
    with pytest.raises(ValueError, match=r"step generate: batch is missing batch\['responses'\].*produced by: rollout"):
        check_after(plan, "generate", _batch(input_ids=1))
    with pytest.raises(ValueError, match=r"step generate: the batch holds \[\"batch\['respones'\]\"\], not in the batch"):
        check_after(plan, "generate", _batch(responses=1, respones=1))
    with pytest.raises(ValueError, match="step filter_groups has no batch contract"):
        check_before(plan, "filter_groups", _batch(input_ids=1))
    check_before(plan, "save_checkpoint", DataProto())  # the cadence reads nothing


def test_check_batch_is_on_by_the_setting_or_the_environment(monkeypatch):
    monkeypatch.delenv(CHECK_BATCH_ENV, raising=False)
    assert not check_batch_enabled(False) and check_batch_enabled(True)
    monkeypatch.setenv(CHECK_BATCH_ENV, "1")
    assert check_batch_enabled(False)


class ContractMode(SumMode):
    """SumMode whose dataset row is ``input_ids`` and whose one step declares it writes ``advantages``."""

    write = True

    def declare_batch_plan(self):
        return BatchPlan(StepContract("rows", writes=("input_ids",)),
                         (StepContract("add", ("input_ids",), writes=("advantages",)),), "ContractMode")

    def next_prompt_batch(self):
        batch = super().next_prompt_batch()
        return DataProto.from_dict({"input_ids": batch.batch["x"]})

    def add(self, batch, metrics):
        if self.write:
            batch.batch["advantages"] = batch.batch["input_ids"].float()
        metrics["sum"] = float(batch.batch["input_ids"].sum())
        return batch


def test_the_core_checks_each_step_when_check_batch_is_on(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECK_BATCH_ENV, raising=False)
    cfg = _cfg(tmp_path / "a", total_training_steps=2, save_freq=-1)
    ContractMode(cfg).fit()  # declared and done
    broken = ContractMode(_cfg(tmp_path / "b", total_training_steps=2, save_freq=-1))
    broken.write = False
    broken.fit()  # check_batch off: nothing is checked
    on = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, check_batch=True,
                                                             default_local_dir=str(tmp_path / "c")))
    broken = ContractMode(on)
    broken.write = False
    with pytest.raises(ValueError, match=r"step add: batch is missing batch\['advantages'\]"):
        broken.fit()


def test_a_broken_plan_stops_the_trainer_before_any_worker(tmp_path):
    class NeedsATeacher(RayPPOTrainer):  # an update that reads what no step of this config makes
        def declare_batch_plan(self):
            plan = super().declare_batch_plan()
            update = StepContract("update_actor", plan.contract("update_actor").reads + ("teacher_log_prob",))
            return dataclasses.replace(plan, steps=plan.steps[:-1] + (update,))

    with pytest.raises(ValueError, match="step update_actor needs batch key 'teacher_log_prob' that no earlier step "
                                         r"produces \(steps: generate -> compute_reward -> compute_advantage -> "
                                         r"update_actor;"):
        NeedsATeacher(_ppo_cfg(tmp_path), for_training=False)


def test_the_command_line_refuses_a_broken_plan_in_one_line(tmp_path, monkeypatch, capsys):
    from hybrid_rl.trainer import main_ppo

    def needs_a_teacher(self):  # the update reads what no step of the default run makes
        return BatchPlan(StepContract("dataset collate", writes=("input_ids",)),
                         (StepContract("update_actor", ("input_ids", "teacher_log_prob")),), "a test")

    monkeypatch.setattr(RayPPOTrainer, "declare_batch_plan", needs_a_teacher)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["main_ppo"])
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main_ppo.main([f"data.arithmetic.cache_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/run"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.splitlines()[-1] == (
        "hybrid_rl config error: step update_actor needs batch key 'teacher_log_prob' that no earlier step produces "
        "(steps: update_actor; dataset collate writes ['input_ids']). Fix: enable the setting that runs the step "
        "producing it (the schema says it comes from: teacher compute_teacher_log_prob) or drop what needs it "
        "(declared in a test)")


def _ppo_cfg(tmp_path, *extra):
    return get_config([f"data.arithmetic.cache_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/run", *extra])


LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"


@pytest.mark.parametrize("extra, steps, update_reads", [
    ((), ["generate", "compute_reward", "compute_advantage", "update_actor"], []),
    (("algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"),
     ["generate", "compute_reward", "compute_old_log_prob", "compute_ref_log_prob", "compute_values",
      "compute_advantage", "update_critic", "update_actor"], ["old_log_probs"]),
    (("actor_rollout_ref.actor.use_kl_loss=true",),
     ["generate", "compute_reward", "compute_ref_log_prob", "compute_advantage", "update_actor"], ["ref_log_prob"]),
    (("algorithm.rollout_correction.preset=tis", LOG_PROBS),
     ["generate", "compute_reward", "compute_old_log_prob", "compute_rollout_correction", "compute_advantage",
      "update_actor"], ["old_log_probs"]),
    (("algorithm.rollout_correction.preset=bypass_ppo_clip", LOG_PROBS),
     ["generate", "compute_reward", "use_rollout_log_probs", "compute_advantage", "update_actor"],
     ["old_log_probs", "rollout_log_probs"]),
])
def test_the_ppo_plan_and_its_reads_follow_the_config(tmp_path, extra, steps, update_reads):
    trainer = RayPPOTrainer(_ppo_cfg(tmp_path, *extra), for_training=False)
    trainer.global_steps = 1
    assert [s.name for s in trainer.batch_plan.steps] == steps == [s for s in trainer.step_plan()
                                                                    if s not in ("validate", "save_checkpoint")]
    reads = trainer.batch_plan.contract("update_actor").reads
    assert reads == ppo_contracts.MODEL_INPUTS + ("response_mask", "advantages", *update_reads)
    advantage_reads = trainer.batch_plan.contract("compute_advantage").reads
    assert ("values" in advantage_reads) == ("compute_values" in steps)  # what ops.compute_advantage is given


def test_the_decoupled_plan_takes_the_scored_rows_from_the_buffer(tmp_path):
    trainer = RayPPOTrainer(_ppo_cfg(tmp_path), for_training=False)
    plan = ppo_contracts.decoupled_batch_plan(trainer.batch_plan, trainer.config)
    plan.check()
    assert [s.name for s in plan.steps] == ["take_experiences", "compute_advantage", "update_actor",
                                            "sync_rollout_weights"]
    assert plan.inputs.writes == ()


def test_the_supervised_modes_declare_their_datasets():
    sft, rm = sft_batch_plan(), rm_batch_plan()
    sft.check()
    rm.check()
    assert "old_log_probs" not in sft.contract("update_actor").reads + sft.contract("update_actor").optional_reads
    assert rm.contract("update_reward_model").reads == rm.inputs.writes == (
        "chosen_input_ids", "chosen_attention_mask", "chosen_position_ids", "rejected_input_ids",
        "rejected_attention_mask", "rejected_position_ids", "margin")


def test_update_actor_reads_what_the_selected_objective_declares():
    """A PPO run whose actor trains another objective (``actor.objective``) declares that objective's
    reads, as the worker builds it: ``nll`` reads no advantages or old log-probs."""
    from hybrid_rl.algorithms.rollout_correction import RolloutCorrectionConfig
    from hybrid_rl.trainer.config import PPOConfig
    from hybrid_rl.trainer.ppo.contracts import actor_update_contract

    cfg = PPOConfig()
    cfg.actor_rollout_ref.actor.objective = {"name": "nll"}
    contract = actor_update_contract(cfg, True, RolloutCorrectionConfig())
    assert contract.reads == ("responses", "input_ids", "attention_mask", "position_ids", "response_mask")
    assert contract.optional_reads == ()
