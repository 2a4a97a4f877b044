"""What SFT and offline DPO share below them: the actor-only trainer base (core/policy_mode.py) and the
check pieces of config/supervised_checks.py, each mode's words spelt out in full."""

from types import SimpleNamespace

import pytest

from hybrid_rl.trainer.config.supervised_checks import (batch_share_problems, build_problem,
                                                        held_out_rollout_problems, supervised_plan)
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.policy_mode import PolicyModeTrainer
from hybrid_rl.trainer.dpo.checks import dpo_plan
from hybrid_rl.trainer.dpo.trainer import DPOTrainer
from hybrid_rl.trainer.main_dpo import dpo_config
from hybrid_rl.trainer.main_sft import sft_config
from hybrid_rl.trainer.sft.trainer import SFTTrainer


def test_both_modes_stand_on_the_base_and_stay_siblings():
    for mode in (SFTTrainer, DPOTrainer):
        assert issubclass(mode, PolicyModeTrainer) and issubclass(mode, TrainerCore)
    assert not issubclass(SFTTrainer, DPOTrainer) and not issubclass(DPOTrainer, SFTTrainer)


@pytest.mark.parametrize("mode, data, hint", [
    (SFTTrainer, {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 4},
     "lower data.micro_batch_size_per_gpu (now 4) or data.max_length, set model.enable_gradient_checkpointing=true, "
     "or train LoRA adapters (model.lora_rank=32); each run"),
    (DPOTrainer, {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 2},
     "lower data.micro_batch_size_per_gpu (now 2 pairs) or data.max_length, set "
     "model.enable_gradient_checkpointing=true, or train LoRA adapters (model.lora_rank=32: the reference is then "
     "the base, no copy); each run"),
    (DPOTrainer, {"use_dynamic_bsz": True, "max_token_len_per_gpu": 640},
     "lower data.max_token_len_per_gpu (now 640) or data.max_length"),
])
def test_the_memory_hint_names_each_modes_budget(mode, data, hint):
    trainer = SimpleNamespace(config=SimpleNamespace(data=SimpleNamespace(**data)),
                              micro_batch_unit=mode.micro_batch_unit, lora_note=mode.lora_note)
    text = PolicyModeTrainer._memory_hint(trainer)
    assert text.startswith("\nIf it ran out of memory (killed without a traceback), see docs/memory.md: ")
    assert hint in text and text.endswith("each run logs perf/peak_rss_gib/<step>.")


def test_the_batch_is_shared_equally_among_the_workers():
    cfg = sft_config(["trainer.n_gpus_per_node=2", "ray_init.num_cpus=2", "data.train_batch_size=3"])
    assert batch_share_problems(cfg, "the pairs") == [
        "data.train_batch_size=3 must be a positive multiple of the 2 workers (trainer.nnodes * "
        "trainer.n_gpus_per_node): each gets an equal share of the pairs."]
    assert batch_share_problems(sft_config(["trainer.n_gpus_per_node=2", "ray_init.num_cpus=2",
                                            "data.train_batch_size=4"]), "a batch") == []


def test_the_held_out_engine_samples_once_at_the_data_lengths():
    cfg = sft_config(["rollout.n=3", "rollout.prompt_length=7"])
    prompt_length = cfg.data.max_prompt_length
    assert held_out_rollout_problems(cfg, "SFT", " per prompt") == [
        "rollout.n=3: SFT samples no responses to train on (its engine only answers the held-out prompts); "
        "leave rollout.n=1 and set rollout.val_kwargs.n for more answers per prompt.",
        f"rollout.prompt_length=7 differs from data.max_prompt_length={prompt_length}; set only "
        "data.max_prompt_length (rollout.prompt_length follows it)."]
    assert held_out_rollout_problems(dpo_config(["rollout.n=2"]), "offline DPO")[0].endswith(
        "set rollout.val_kwargs.n for more answers.")
    assert held_out_rollout_problems(sft_config([]), "SFT") == []


def test_a_build_that_refuses_is_one_problem():
    def refuse(cfg):
        raise ValueError(f"bad {cfg}")

    assert build_problem(refuse, "x") == ["bad x"] and build_problem(lambda cfg: cfg, "x") == []


@pytest.mark.parametrize("overrides, reference", [([], True), (["dpo.loss_type=simpo"], False)])
def test_dpo_plans_the_reference_only_when_its_loss_reads_it(overrides, reference):
    cfg = dpo_config(overrides)
    assert dpo_plan(cfg).use_reference_policy is reference
    assert dpo_plan(cfg) == supervised_plan(cfg, use_reference_policy=reference)
    assert supervised_plan(sft_config([])).use_reference_policy is False
