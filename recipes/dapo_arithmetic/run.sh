#!/usr/bin/env bash
# DAPO on the default arithmetic task (CPU): GRPO's estimator with DAPO's pieces, clip-higher
# (0.2 / 0.28), token-mean loss, no KL, dynamic sampling (groups whose answers are all right or all
# wrong are dropped and more prompts generated, at most 3 generation batches per step) and the soft
# overlong punishment over the last 2 of the 16 response tokens. Extra key=value arguments win.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.filter_groups.enable=true \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=3 \
    reward_model.overlong_buffer.enable=true \
    reward_model.overlong_buffer.len=2 \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    reward_model.overlong_buffer.log=true \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_kl_loss=false \
    data.train_batch_size=16 \
    actor_rollout_ref.rollout.n=8 \
    trainer.total_training_steps=8 \
    trainer.test_freq=4 \
    trainer.experiment_name=dapo_arithmetic \
    "$@"
