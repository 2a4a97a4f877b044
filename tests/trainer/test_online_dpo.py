"""Online DPO in the PPO loop: a paired actor objective changes the step plan (no old log-probs, no
advantage, no critic), pairs are built from each prompt group, a step without pairs skips the
update, and the config checks refuse what it cannot run with, in one line each."""

import numpy as np
import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.checks import make_run_plan, validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.config.paired_checks import paired_notices
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.trainer.ppo import contracts as ppo_contracts
from hybrid_rl.trainer.ppo.paired import ONE_OPTIMIZER_STEP, build_pair_batch, trim_pairs
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from hybrid_rl.data.online_pairs import best_worst_pairs

from trainer_fakes import FakeActorRollout, FakePool

DPO = "actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}"
KEY = "actor_rollout_ref.actor.objective.name=dpo (pairs of each prompt's responses)"


def _cfg(tmp_path, *extra):
    return get_config([f"data.arithmetic.cache_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/run", *extra])


def test_a_paired_objective_plans_pairs_then_reference_then_update(tmp_path):
    trainer = RayPPOTrainer(_cfg(tmp_path, DPO), for_training=False)
    trainer.global_steps = 1
    names = ["generate", "compute_reward", "build_pairs", "compute_ref_log_prob", "update_actor"]
    assert [s.name for s in trainer.batch_plan.steps] == names == trainer.step_plan()[:5]
    update = trainer.batch_plan.contract("update_actor")
    assert update.reads == ppo_contracts.MODEL_INPUTS + ("response_mask", "ref_log_prob")
    assert trainer.batch_plan.contract("build_pairs").reads == ("token_level_scores", "uid")
    assert trainer.plan.use_reference_policy and not trainer.plan.use_critic


def test_a_reference_free_objective_plans_no_reference_pass(tmp_path):
    cfg = to_ppo_config(_cfg(tmp_path, "actor_rollout_ref.actor.objective={name: dpo, loss_type: simpo}"))
    plan = make_run_plan(cfg)
    assert not plan.use_reference_policy
    steps = ppo_contracts.ppo_batch_plan(cfg, plan, None)
    assert [s.name for s in steps.steps] == ["generate", "compute_reward", "build_pairs", "update_actor"]
    steps.check()


def _scored(uids, scores):
    """A scored rollout of len(uids) rows, 2 response tokens, the score on the last token; row i's
    ``responses`` are [i, i] so the tests can see which rows were kept."""
    rows = len(uids)
    tokens = torch.zeros(rows, 2)
    tokens[:, -1] = torch.tensor(scores)
    ids = torch.arange(rows)[:, None].repeat(1, 2)
    return DataProto.from_dict(
        tensors={"responses": ids, "response_mask": torch.ones(rows, 2), "token_level_scores": tokens},
        non_tensors={"uid": np.array(uids, dtype=object)})


def test_build_pairs_keeps_best_vs_worst_and_counts_ties_and_trims():
    # groups: a (best row 0, worst row 1), b (tie), c (best row 6, worst 5), d (one row)
    batch = _scored(["a", "a", "a", "b", "b", "c", "c", "d"], [1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 2.0, 3.0])
    pairs, step, metrics = build_pair_batch(batch, ranks=1)
    assert pairs.batch["responses"][:, 0].tolist() == [0, 1, 6, 5]  # chosen, rejected, chosen, rejected
    assert pairs.non_tensor_batch["uid"].tolist() == ["a", "a", "c", "c"]
    # margins: a 1 - 0 = 1, c 2 - 0 = 2 -> mean 1.5
    assert metrics == {"online_dpo/pairs": 2.0, "online_dpo/tie_groups": 1.0, "online_dpo/score_margin": 1.5,
                       "online_dpo/trimmed_pairs": 0.0}
    assert step.pairs == 2 and len(step.rollout) == 8  # the whole rollout is what the step logs
    assert torch.equal(step.rollout.batch["token_level_rewards"], batch.batch["token_level_scores"])
    assert "token_level_rewards" not in batch.batch.keys()  # the rollout is a copy, the batch untouched
    trimmed, step, metrics = build_pair_batch(batch, ranks=3)  # 2 pairs over 3 ranks: none fits
    assert len(trimmed) == 0 and step.pairs == 0 and metrics["online_dpo/trimmed_pairs"] == 2.0


def test_trim_pairs_keeps_a_multiple_of_the_ranks():
    selection = best_worst_pairs(np.array(list("aabbcc"), dtype=object), torch.tensor([1.0, 0, 1, 0, 1, 0]))
    kept, dropped = trim_pairs(selection, 2)
    assert (len(kept), dropped) == (2, 1) and kept.chosen.tolist() == [0, 2] and kept.rejected.tolist() == [1, 3]
    assert trim_pairs(selection, 3) == (selection, 0)


class PairActor(FakeActorRollout):
    """The fake actor whose update records what online DPO gives it (no advantages)."""

    def __init__(self):
        super().__init__()
        self.updates: list[tuple[int, bool, list[int]]] = []

    def update_actor(self, data):
        self.calls.append("update_actor")
        assert "advantages" not in data.batch.keys() and "old_log_probs" not in data.batch.keys()
        uids = data.non_tensor_batch["uid"]
        assert all(uids[0::2] == uids[1::2])  # rows 2i and 2i+1 answer the same prompt
        self.updates.append((len(data), bool(data.meta_info.get(ONE_OPTIMIZER_STEP)), data.batch["ref_log_prob"].shape))
        return DataProto(meta_info={"metrics": {"dpo/loss": [0.69]}})


def _trainer(tmp_path, model_dir, scores):
    cfg = get_config([f"actor_rollout_ref.model.path={model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
                      "data.arithmetic.num_train=40", "data.arithmetic.num_test=6", "data.arithmetic.num_shots=0",
                      "data.train_batch_size=4", "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=2",
                      "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
                      "trainer.val_at_end=false", f"trainer.default_local_dir={tmp_path}/run",
                      "trainer.progress_bar=false", "trainer.check_batch=true", DPO])
    trainer = RayPPOTrainer(cfg)
    trainer.workers = WorkerGroups(PairActor(), None, FakePool())

    def reward_fn(batch, return_dict=True):
        rewards = torch.zeros(batch.batch["responses"].shape)
        rewards[:, -1] = torch.tensor([scores(i) for i in range(len(batch))], dtype=torch.float32)
        return {"reward_tensor": rewards}

    trainer.reward_fn = reward_fn
    return trainer


def test_online_dpo_steps_train_on_the_pairs(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, lambda row: float(row % 2 == 0))  # each group: row 0 best
    metrics = trainer.fit()
    actor = trainer.workers.actor_rollout
    assert "compute_log_prob" not in actor.calls
    assert actor.calls.count("compute_ref_log_prob") == 2
    assert actor.updates == [(8, True, (8, 4))] * 2  # 4 prompts -> 4 pairs = 8 rows, one optimizer step
    assert metrics["online_dpo/pairs"] == 4.0 and metrics["online_dpo/update_skipped"] == 0.0
    assert metrics["critic/score/mean"] == 0.5  # the whole rollout's mean score (8 rows), as GRPO logs it
    assert metrics["dpo/loss"] == 0.69 and "critic/advantages/mean" not in metrics


def test_a_step_without_pairs_skips_the_update_and_says_so_once(tmp_path, tiny_model_dir, caplog):
    trainer = _trainer(tmp_path, tiny_model_dir, lambda row: 1.0)  # every group ties
    with caplog.at_level("WARNING"):
        metrics = trainer.fit()
    actor = trainer.workers.actor_rollout
    assert "update_actor" not in actor.calls and "compute_ref_log_prob" not in actor.calls
    assert metrics["online_dpo/pairs"] == 0.0 and metrics["online_dpo/tie_groups"] == 4.0
    assert metrics["online_dpo/update_skipped"] == 1.0
    assert sum("has no pair" in r.getMessage() for r in caplog.records) == 1  # 2 skipped steps, logged once


@pytest.mark.parametrize("extra, message", [
    (("actor_rollout_ref.rollout.n=1",),
     f"{KEY} needs two or more responses per prompt, but actor_rollout_ref.rollout.n=1. Fix: set "
     "actor_rollout_ref.rollout.n >= 2 (e.g. 8)."),
    (("algorithm.adv_estimator=gae",),
     f"{KEY} trains no critic and reads no advantage, but algorithm.adv_estimator=gae needs a critic. Fix: set "
     "algorithm.adv_estimator=grpo (unused by dpo)."),
    (("algorithm.use_kl_in_reward=true",),
     f"{KEY} reads no reward-derived advantage, so algorithm.use_kl_in_reward=true has no effect. Fix: set "
     "algorithm.use_kl_in_reward=false (dpo's beta sets its pull to the reference)."),
    (("actor_rollout_ref.actor.use_kl_loss=true",),
     f"{KEY} replaces PPO's loss terms, so actor_rollout_ref.actor.use_kl_loss=true has no term to add to. Fix: "
     "set actor_rollout_ref.actor.use_kl_loss=false (dpo's beta sets its pull to the reference)."),
    (("async_training.enable=true",),
     f"{KEY} runs in the colocated loop only; async_training.enable=true is not supported with it. Fix: set "
     "async_training.enable=false."),
    (("algorithm.rollout_correction.preset=tis", "actor_rollout_ref.rollout.calculate_log_probs=true"),
     f"{KEY} has no old log-probs or importance ratio to correct, so algorithm.rollout_correction does not apply. "
     "Fix: leave algorithm.rollout_correction at its defaults."),
])
def test_the_checks_refuse_what_online_dpo_cannot_run_with(tmp_path, extra, message):
    with pytest.raises(ValueError) as error:
        validate_config(to_ppo_config(_cfg(tmp_path, DPO, *extra)), training=False)
    assert message in [line.removeprefix("- ") for line in str(error.value).splitlines()]


def test_another_estimator_is_a_notice_not_an_error(tmp_path):
    cfg = to_ppo_config(_cfg(tmp_path, DPO, "algorithm.adv_estimator=rloo"))
    validate_config(cfg, training=False)
    assert paired_notices(cfg) == [
        "algorithm.adv_estimator=rloo is not used: actor_rollout_ref.actor.objective.name=dpo trains on the best vs "
        "worst response of each prompt group, ranked by reward (no advantage is computed)"]
    assert paired_notices(_cfg(tmp_path, DPO)) == []
    assert paired_notices(_cfg(tmp_path, "algorithm.adv_estimator=rloo")) == []  # GRPO-family run: no notice


def test_main_ppo_refuses_kl_in_reward_in_one_line(tmp_path, monkeypatch, capsys):
    from hybrid_rl.trainer import main_ppo

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main_ppo.main([f"data.arithmetic.cache_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/run", DPO,
                       "algorithm.use_kl_in_reward=true"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hybrid_rl config error: {KEY} reads no reward-derived advantage, so algorithm.use_kl_in_reward=true has no "
        "effect. Fix: set algorithm.use_kl_in_reward=false (dpo's beta sets its pull to the reference).")


def test_the_recipe_is_the_default_run_with_the_objective_and_8_steps():
    from test_recipes import RECIPES, compose, recipe_overrides

    path = next(p for p in RECIPES if p.endswith("online_dpo_arithmetic/run.sh"))
    entry, overrides = "hybrid_rl.trainer.main_ppo", recipe_overrides(path)
    changed = [DPO, "trainer.total_training_steps=8", "trainer.save_freq=-1", "trainer.logger=[console,jsonl]",
               "trainer.experiment_name=online_dpo_arithmetic"]
    assert compose(entry, overrides) == compose(entry, changed)
