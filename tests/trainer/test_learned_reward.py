"""reward_model.* in RL: the one-line refusals of bad settings, the score combination and its metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.checks import make_run_plan, validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.config.reward_model import check_reward_model, is_remote
from hybrid_rl.trainer.ppo.learned_reward import combine_scores, rule_scores_wanted, score_metrics
from hybrid_rl.utils.bounds import bound_problems


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tiny_model_dir):
    from tests.tiny_models import build_tiny_reward_model_dir

    return build_tiny_reward_model_dir(tmp_path_factory.mktemp("rm") / "rm", tiny_model_dir)


def _cfg(*overrides):
    return to_ppo_config(get_config(["reward_model.enable=true", *overrides]))


def test_a_reward_model_folder_and_a_url_are_accepted(rm_dir):
    assert check_reward_model(_cfg(f"reward_model.model.path={rm_dir}")) == []
    remote = _cfg("reward_model.model.path=http://127.0.0.1:8000/score")
    assert check_reward_model(remote) == [] and is_remote(remote.reward_model.model.path)
    assert make_run_plan(_cfg(f"reward_model.model.path={rm_dir}")).use_reward_model
    assert not make_run_plan(remote).use_reward_model  # scored from the driver


@pytest.mark.parametrize("overrides, message", [
    ([], r"reward_model.enable=true needs reward_model.model.path"),
    (["reward_model.model.path=/no/such/rm"], r"reward_model.model.path='/no/such/rm' is not a model folder"),
    (["reward_model.model.path={base}"], r"holds \['LlamaForCausalLM'\], not a reward model"),
    (["reward_model.model.path={rm}", "reward_model.normalize=true"], r"reward_model.normalize=true but .* no mean"),
    (["reward_model.model.path={rm}", "reward_model.rm_weight=0"], r"rm_weight and rule_weight are both 0"),
    (["reward_model.model.path={rm}", "reward_model.micro_batch_size_per_gpu=0"], r"micro_batch_size_per_gpu=0"),
    (["reward_model.model.path={rm}", "reward_model.max_length=1"], r"reward_model.max_length=1 is invalid: must be >= 2"),
    (["reward_model.model.path={rm}", "data.return_raw_chat=false"], r"set data.return_raw_chat=true"),
])
def test_bad_reward_model_settings_are_one_line(rm_dir, tiny_model_dir, overrides, message):
    cfg = _cfg(*[o.format(rm=rm_dir, base=tiny_model_dir) for o in overrides])
    errors = check_reward_model(cfg) + bound_problems(cfg)  # ranges are declared on the fields
    assert len(errors) == 1 and "\n" not in errors[0]
    assert __import__("re").search(message, errors[0]), errors[0]


def test_two_labels_are_not_a_reward_model(tmp_path, rm_dir):
    import shutil

    folder = tmp_path / "classifier"
    shutil.copytree(rm_dir, folder)
    config = json.load(open(folder / "config.json"))
    config["id2label"] = {"0": "NEG", "1": "POS"}
    json.dump(config, open(folder / "config.json", "w"))
    (error,) = check_reward_model(_cfg(f"reward_model.model.path={folder}"))
    assert "not a reward model" in error


def test_the_decoupled_mode_accepts_a_learned_reward_model(rm_dir):
    """It is hosted by the rollout processes (tests/trainer/test_e2e_rm.py runs it)."""
    cfg = _cfg(f"reward_model.model.path={rm_dir}", "async_training.enable=true", "rollout.n_gpus_per_node=1",
               "trainer.n_gpus_per_node=1", "ray_init.num_cpus=2", "async_training.max_head_offpolicyness=0",
               "actor_rollout_ref.rollout.calculate_log_probs=true")  # partial rollout (the default) needs them
    validate_config(cfg)
    plan = make_run_plan(cfg)
    assert plan.use_reward_model and plan.rollout_world_size == 1


def test_scores_combine_with_the_weights_and_are_logged_side_by_side():
    rm = torch.tensor([[0.0, 2.0], [-1.0, 0.0], [0.0, 0.5]])  # [B, R], score at the last token
    rule = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(combine_scores(rm, rule, 1.0, 0.0), rm)
    torch.testing.assert_close(combine_scores(rm, rule, 0.5, 2.0), 0.5 * rm + 2.0 * rule)
    torch.testing.assert_close(combine_scores(rm, None, 1.0, 0.0), rm)
    metrics = score_metrics(rm, rule, torch.tensor([3.0, 1.0, 2.0]))
    assert metrics["critic/rm_score/mean"] == pytest.approx(0.5) and metrics["critic/rule_score/mean"] == pytest.approx(2 / 3)
    assert metrics["critic/rm_score/max"] == 2.0 and metrics["critic/rm_score/min"] == -1.0
    assert metrics["critic/rm_score_raw/mean"] == pytest.approx(2.0)
    expected = float(np.corrcoef([2.0, -1.0, 0.5], [1.0, 0.0, 1.0])[0, 1])
    assert metrics["critic/rm_rule_corr"] == pytest.approx(expected, rel=1e-5)


class _Manager:
    def __init__(self, default: bool):
        self.uses_default_scorer = default


def _batch(source: str) -> DataProto:
    from hybrid_rl.protocol_utils import to_object_array

    return DataProto.from_dict({"x": torch.zeros(1)}, non_tensors={
        "data_source": to_object_array([source]), "reward_model": to_object_array([{"ground_truth": "1"}])})


def test_the_rule_score_runs_when_it_can(rm_dir):
    cfg = _cfg(f"reward_model.model.path={rm_dir}")
    assert rule_scores_wanted(cfg, _Manager(True), _batch("arithmetic"))
    assert not rule_scores_wanted(cfg, _Manager(True), _batch("no_such_source"))  # no scorer: RM only
    assert rule_scores_wanted(cfg, _Manager(False), _batch("no_such_source"))  # a custom function scores anything
    weighted = _cfg(f"reward_model.model.path={rm_dir}", "reward_model.rule_weight=0.5")
    assert rule_scores_wanted(weighted, _Manager(True), _batch("no_such_source"))  # weighted: must run (and fail loudly)
