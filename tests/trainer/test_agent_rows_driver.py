"""Issue 57 item 2, the driver: a rollout's rows share one advantage (the estimator on one row per rollout,
1/k each), the input columns follow a rollout's rows, zero-mask padding adds nothing to any loss or
denominator, and the settings that cannot run with several rows per rollout are refused in one line."""

import math

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, global_batch_denominators
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.agent_rows_checks import check_agent_rows
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.ppo import agent_rows, ops


def _scored(scores, lengths, uids, rollout_row, width=4):
    rewards, mask = torch.zeros(len(scores), width), torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n], rewards[i, n - 1] = 1, s
    return DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids, "rollout_row": rollout_row})


def test_the_advantage_step_shares_a_rollouts_advantage_among_its_rows_over_k():
    # prompt a: input rows 0 (three rows, score 1) and 1 (one row, 0); prompt b: rows 2 and 3 (one row each, 1)
    data = _scored([1, 1, 1, 0, 1, 1], [2, 3, 1, 4, 2, 2], ["a", "a", "a", "a", "b", "b"], [0, 0, 0, 1, 2, 3])
    out = ops.compute_advantage(data, "grpo")
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group a over its two rollouts [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    for row, value in enumerate([a / 3, a / 3, a / 3, -a, 0.0, 0.0]):
        n = int(data.batch["response_mask"][row].sum())
        assert out.batch["advantages"][row, :n].tolist() == pytest.approx([value] * n)
    rows_only = DataProto.from_dict(dict(data.batch.items()), non_tensors={"uid": data.non_tensor_batch["uid"]})
    plain = ops.compute_advantage(rows_only, "grpo")
    assert plain.batch["advantages"][3, 0].item() != pytest.approx(-a)  # over rows the baseline would be 0.75


def test_without_rollout_columns_the_advantage_step_is_the_estimator_itself():
    data = _scored([1, 0, 1, 1], [2, 3, 1, 2], ["a", "a", "b", "b"], [0, 1, 2, 3])
    chain = DataProto.from_dict(dict(data.batch.items()), non_tensors={"uid": data.non_tensor_batch["uid"]})
    rows = ops.compute_advantage(data, "grpo").batch["advantages"]
    expected = ops.compute_advantage(chain, "grpo").batch["advantages"]
    assert torch.allclose(rows, expected, rtol=0, atol=1e-6)  # k = 1: the estimator (to float rounding of a mean)


def test_the_input_columns_follow_the_rollouts_rows():
    rest = DataProto.from_dict(non_tensors={"uid": ["a", "a", "b"], "data_source": ["x", "y", "z"]})
    output = DataProto.from_dict({"responses": torch.zeros(5, 2)},
                                 non_tensors={agent_rows.ROLLOUT_ROW: [0, 0, 1, 2, 2]})
    expanded = agent_rows.expand_to_rollout_rows(rest, output)
    assert list(expanded.non_tensor_batch["data_source"]) == ["x", "x", "y", "z", "z"]
    one_each = DataProto.from_dict({"responses": torch.zeros(3, 2)}, non_tensors={agent_rows.ROLLOUT_ROW: [0, 1, 2]})
    assert agent_rows.expand_to_rollout_rows(rest, one_each) is rest


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_zero_mask_padding_adds_nothing_to_the_loss_or_its_denominators(mode):
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 6, generator=g) > 0.3).float()
    mask[:, 0] = 1
    batch = DataProto.from_dict({"response_mask": mask, "advantages": torch.randn(5, 6, generator=g),
                                 "loss": torch.randn(5, 6, generator=g)}, non_tensors={"uid": list("abcde")})
    padded = agent_rows.pad_for_update(batch, world_size=4)
    assert len(padded) == 8 and len(batch) == 5  # a copy; the step's batch keeps its rows
    assert padded.batch["response_mask"][5:].sum() == 0 and padded.batch["advantages"][5:].sum() == 0
    dens, pad_dens = (global_batch_denominators(b.batch["response_mask"]) for b in (batch, padded))
    assert {k: v.item() for k, v in dens.items()} == {k: v.item() for k, v in pad_dens.items()}
    whole = agg_loss(batch.batch["loss"], batch.batch["response_mask"], mode, **dens)
    # each of 4 ranks' share of the padded batch, with the global denominators, sums to the unpadded loss
    shares = [agg_loss(c.batch["loss"], c.batch["response_mask"], mode, **pad_dens) for c in padded.chunk(4)]
    assert torch.stack(shares).sum().item() == pytest.approx(whole.item(), rel=1e-6)
    assert agent_rows.pad_for_update(batch, world_size=5) is batch


def _problems(*overrides):
    return check_agent_rows(to_ppo_config(get_config(["actor_rollout_ref.rollout.agent.rows=every_call",
                                                      "data.train_batch_size=4",
                                                      "actor_rollout_ref.actor.ppo_mini_batch_size=4", *overrides])))


def test_every_call_refuses_what_needs_fixed_rows_or_per_token_advantages_in_one_line_each():
    assert _problems("algorithm.adv_estimator=grpo") == []
    key = "actor_rollout_ref.rollout.agent.rows=every_call"
    assert _problems("algorithm.adv_estimator=gae") == [
        f"{key} shares one rollout's advantage among its rows, but algorithm.adv_estimator=gae gives advantages "
        "that vary along a response (or a per-row baseline). Fix: use an outcome estimator such as grpo or rloo, "
        "or agent.rows=chain."]
    for estimator in ("reinforce_plus_plus", "remax"):
        assert len(_problems(f"algorithm.adv_estimator={estimator}")) == 1
    assert _problems("async_training.enable=true") == [
        f"{key} is wired for the synchronous (batch) rollout only, but async_training.enable=true (the decoupled / "
        "streaming / partial-rollout path). Fix: set async_training.enable=false, or agent.rows=chain."]
    assert _problems("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc") == [
        f"{key} gives a prompt group a varying number of rows, but algorithm.filter_groups.enable=true selects "
        "groups of rollout.n rows. Fix: set algorithm.filter_groups.enable=false, or agent.rows=chain."]
    assert _problems("actor_rollout_ref.actor.ppo_mini_batch_size=2") == [
        f"{key} makes the step's rows one mini-batch (their number varies), but "
        "actor_rollout_ref.actor.ppo_mini_batch_size=2 != data.train_batch_size=4. Fix: set them equal "
        "(ppo_epochs repeats the update), or agent.rows=chain."]
    assert _problems("actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}") == [
        f"{key} gives a prompt group a varying number of rows, but actor_rollout_ref.actor.objective.name=dpo trains "
        "best-vs-worst pairs of rollouts. Fix: use PPO's objective, or agent.rows=chain."]
    chain = to_ppo_config(get_config(["algorithm.adv_estimator=gae", "async_training.enable=true"]))
    assert check_agent_rows(chain) == []  # rows=chain: nothing changes
