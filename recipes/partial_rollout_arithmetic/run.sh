#!/usr/bin/env bash
# The decoupled run (recipes/async_arithmetic) with partial rollout: the rollout streams prompt groups into
# the experience buffer as each finishes, and a weight push interrupts the requests in flight, which continue
# from the tokens already sampled with the new weights (every token keeps its version and behaviour log-prob).
# docs/async.md, "Partial rollout".
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m hybrid_rl.trainer.main_ppo \
    async_training.enable=true \
    async_training.partial_rollout=true \
    async_training.max_head_offpolicyness=1 \
    async_training.trigger_parameter_sync_step=1 \
    rollout.n_gpus_per_node=1 \
    trainer.n_gpus_per_node=1 \
    actor_rollout_ref.actor.policy_loss.loss_mode=decoupled \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    trainer.experiment_name=arithmetic_grpo_partial_rollout \
    "$@"
