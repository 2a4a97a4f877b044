"""Worker configs (validation, derived sizes), micro-batch packing and the LR schedule."""

from __future__ import annotations

import pytest
import torch

from hybrid_rl.workers.batching import balanced_partitions, dynamic_partitions, restore_order, split_micro_batches
from hybrid_rl.workers.builders import build_lr_scheduler
from hybrid_rl.workers.config import (ActorConfig, ActorRolloutRefConfig, CheckpointConfig, CriticConfig,
                                      ModelConfig, OptimConfig, derive_batch_sizes)
from tests.workers.helpers import make_batch


# ------------------------------------------------------------------ config
def test_defaults_build_and_keep_user_fields():
    cfg = ActorRolloutRefConfig()
    assert cfg.model.path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg.actor.effective_clip_ratio_low == cfg.actor.effective_clip_ratio_high == 0.2
    actor = ActorConfig(clip_ratio_high=0.28)
    assert (actor.effective_clip_ratio_low, actor.effective_clip_ratio_high) == (0.2, 0.28)
    assert actor.clip_ratio_low is None  # derived, never written back


@pytest.mark.parametrize("build, message", [
    (lambda: ActorConfig(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=None), "ppo_micro_batch_size_per_gpu"),
    (lambda: ActorConfig(loss_agg_mode="mean"), "actor.loss_agg_mode='mean'"),
    (lambda: ActorConfig(kl_loss_type="full"), "actor.kl_loss_type"),
    (lambda: ActorConfig(clip_ratio_c=1.0), "clip_ratio_c"),
    (lambda: ActorConfig(strategy="megatron"), "actor.strategy"),
    (lambda: CriticConfig(rollout_n=0), "critic.rollout_n"),
    (lambda: OptimConfig(lr_scheduler_type="linear"), "optim.lr_scheduler_type"),
    (lambda: OptimConfig(betas=[0.9]), "optim.betas"),
    (lambda: ModelConfig(dtype="int8"), "model.dtype"),
    (lambda: CheckpointConfig(save_contents=["weights"]), "checkpoint.save_contents"),
])
def test_invalid_values_raise_with_key_and_fix(build, message):
    with pytest.raises(ValueError, match="Fix:") as err:
        build()
    assert message in str(err.value)


def test_dynamic_bsz_needs_no_micro_batch_size():
    assert ActorConfig(use_dynamic_bsz=True, ppo_micro_batch_size_per_gpu=None).ppo_micro_batch_size_per_gpu is None


def test_warmup_style_alias_warns_and_wins():
    with pytest.warns(FutureWarning, match="warmup_style"):
        optim = OptimConfig(warmup_style="cosine")
    assert optim.scheduler_type == "cosine" and optim.lr_scheduler_type == "constant"


def test_derived_batch_sizes():
    sizes = derive_batch_sizes(key="actor", ppo_mini_batch_size=6, n=4, dp_size=3,
                               ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=None)
    assert sizes.ppo_mini_batch_size_per_gpu == 8
    with pytest.raises(ValueError, match="5 prompts x n=3 = 15 rows must divide over the 2"):
        derive_batch_sizes(key="actor", ppo_mini_batch_size=5, n=3, dp_size=2,
                           ppo_micro_batch_size_per_gpu=1, log_prob_micro_batch_size_per_gpu=1)
    assert sizes.log_prob_micro_batch_size_per_gpu == 2  # null = the training micro-batch


def test_verl_global_micro_batch_is_split_over_the_ranks():
    sizes = derive_batch_sizes(key="actor", ppo_mini_batch_size=6, n=4, dp_size=3, ppo_micro_batch_size_per_gpu=8,
                               ppo_micro_batch_size=6, log_prob_micro_batch_size_per_gpu=None)
    assert sizes.ppo_micro_batch_size_per_gpu == 2 and sizes.log_prob_micro_batch_size_per_gpu == 2
    with pytest.raises(ValueError, match=r"actor.ppo_micro_batch_size=5 .* must divide over the 3"):
        derive_batch_sizes(key="actor", ppo_mini_batch_size=6, n=4, dp_size=3, ppo_micro_batch_size_per_gpu=None,
                           ppo_micro_batch_size=5, log_prob_micro_batch_size_per_gpu=None)


# ------------------------------------------------------------------ batching
def test_balanced_partitions_hand_example():
    # LPT, longest first into the lightest group: 9->A, 7->B, 6->B (13), 5->A (14), 4->B (17), 2->A (16)
    seqlens = [5, 9, 2, 7, 4, 6]
    groups = balanced_partitions(seqlens, 2)
    assert groups == [[0, 1, 2], [3, 4, 5]]
    assert sorted(sum(seqlens[i] for i in g) for g in groups) == [16, 17]


def test_dynamic_partitions_respect_the_budget():
    seqlens = [10, 3, 8, 8, 2, 9, 1]
    groups = dynamic_partitions(seqlens, 16, key="actor.ppo_max_token_len_per_gpu")
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert all(sum(seqlens[i] for i in g) <= 16 for g in groups)
    assert len(groups) == 3  # ceil(41 / 16) = 3 bins suffice
    with pytest.raises(ValueError, match="smaller than one row of 10 tokens"):
        dynamic_partitions(seqlens, 9, key="actor.ppo_max_token_len_per_gpu")


def test_split_and_restore_order():
    data = make_batch(num_rows=7)
    micro, order = split_micro_batches(data, micro_batch_size=None, use_dynamic_bsz=True, max_token_len=15,
                                       key="k")
    assert sum(len(m) for m in micro) == 7 and order is not None
    stacked = torch.cat([m.batch["input_ids"] for m in micro])
    torch.testing.assert_close(restore_order(stacked, order), data.batch["input_ids"])
    fixed, order = split_micro_batches(data, micro_batch_size=3, use_dynamic_bsz=False, max_token_len=None,
                                       key="k")
    assert [len(m) for m in fixed] == [3, 3, 1] and order is None


# ------------------------------------------------------------------ LR schedule
def _lrs(optim, total, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    sched = build_lr_scheduler(opt, optim, key="actor.optim", total_training_steps=total)
    lrs = []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


def test_constant_schedule_with_warmup():
    assert _lrs(OptimConfig(lr=1.0, lr_warmup_steps=2), 10, 4) == [0.0, 0.5, 1.0, 1.0]


def test_cosine_schedule_hand_values():
    # warm-up 2 of 6 steps, then cos over 4 steps down to min_lr_ratio 0.2
    lrs = _lrs(OptimConfig(lr=1.0, lr_warmup_steps_ratio=1 / 3, lr_scheduler_type="cosine", min_lr_ratio=0.2), 6, 7)
    expected = [0.0, 0.5, 1.0, 0.2 + 0.8 * 0.5 * (1 + 0.5 ** 0.5), 0.6, 0.2 + 0.8 * 0.5 * (1 - 0.5 ** 0.5), 0.2]
    assert lrs == pytest.approx(expected)


def test_user_total_steps_wins_and_cosine_needs_one():
    assert _lrs(OptimConfig(lr=1.0, lr_scheduler_type="cosine", total_training_steps=2), 100, 3) == \
        pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="actor.optim.total_training_steps"):
        _lrs(OptimConfig(lr_scheduler_type="cosine"), None, 1)
