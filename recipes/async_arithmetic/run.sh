#!/usr/bin/env bash
# The default run (GRPO on arithmetic, embedded SmolLM2-135M-Instruct, CPU) in the decoupled
# (asynchronous) mode: one rollout worker and one training worker (a core each on 2 cores), the
# rollout running up to one policy version ahead (eta = 1) into the in-memory experience buffer,
# AReaL's decoupled PPO loss correcting for the lag with the rollout's log-probs. docs/async.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m hybrid_rl.trainer.main_ppo \
    async_training.enable=true \
    async_training.max_head_offpolicyness=1 \
    async_training.trigger_parameter_sync_step=1 \
    rollout.n_gpus_per_node=1 \
    trainer.n_gpus_per_node=1 \
    actor_rollout_ref.actor.policy_loss.loss_mode=decoupled \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    trainer.experiment_name=arithmetic_grpo_async \
    "$@"
