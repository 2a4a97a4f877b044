#!/usr/bin/env bash
# The default run (GRPO on arithmetic, embedded SmolLM2-135M-Instruct, CPU) with a LoRA actor:
# rank 32 adapters on every linear layer, 10x the full fine-tuning learning rate. Only the adapters
# train and hold optimizer state; the reference (when a KL term needs one) is the base model with
# the adapter disabled; the rollout engine gets merged weights after every update.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m hybrid_rl.trainer.main_ppo \
    actor_rollout_ref.model.lora_rank=32 \
    actor_rollout_ref.model.lora_alpha=64 \
    actor_rollout_ref.model.target_modules=all-linear \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    trainer.experiment_name=arithmetic_grpo_lora \
    "$@"
