#!/usr/bin/env bash
# Online DPO on the default task: the default run (recipes/arithmetic_grpo: the embedded
# SmolLM2-135M-Instruct, synthetic 1-digit arithmetic, 16 prompts x 8 answers per step, CPU) with one
# switch, actor_rollout_ref.actor.objective: each prompt's 8 sampled answers are ranked by the reward
# function, its best and worst answers form a (chosen, rejected) pair (a group whose answers all score
# the same is skipped), and the actor takes one optimizer step of TRL's sigmoid DPO loss over the
# step's pairs against the frozen start model (the reference). 8 steps, held-out accuracy at 0, 2, 4, 6, 8.
# The GRPO baseline on the same steps: bash recipes/arithmetic_grpo/run.sh trainer.total_training_steps=8
# Every other value is the config's default, spelled out; extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

python -m hybrid_rl.trainer.main_ppo \
    'actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}' \
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
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=8 \
    trainer.test_freq=2 \
    trainer.save_freq=-1 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=online_dpo_arithmetic \
    "$@"
