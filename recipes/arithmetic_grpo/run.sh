#!/usr/bin/env bash
# The default run: GRPO on the embedded SmolLM2-135M-Instruct, synthetic 1-digit arithmetic
# (generated into ~/.cache/hybrid_rl/arithmetic on first use), CPU, one worker using every core.
# Every value is the config's default (hybrid_rl/trainer/config/schema.py and the workers' dataclasses); spelled out
# here so the recipe documents itself. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    data.arithmetic.ops='[+,"-","*"]' \
    data.arithmetic.max_digits=1 \
    data.arithmetic.num_train=100 \
    data.arithmetic.num_test=200 \
    data.arithmetic.num_shots=1 \
    data.train_batch_size=16 \
    data.max_prompt_length=128 \
    data.max_response_length=16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=0.8 \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=4 \
    trainer.test_freq=2 \
    trainer.save_freq=10 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=arithmetic_grpo \
    "$@"
