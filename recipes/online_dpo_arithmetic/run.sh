#!/usr/bin/env bash
# Online DPO on the default task: the default run (recipes/arithmetic_grpo/run.sh, run as is: the
# embedded SmolLM2-135M-Instruct, synthetic 1-digit arithmetic, 16 prompts x 8 answers per step, CPU)
# with one switch, actor_rollout_ref.actor.objective: each prompt's 8 sampled answers are ranked by the
# reward function, its best and worst answers form a (chosen, rejected) pair (a group whose answers all
# score the same is skipped), and the actor takes one optimizer step of TRL's sigmoid DPO loss over the
# step's pairs against the frozen start model (the reference). 8 steps, held-out accuracy at 0, 2, 4, 6, 8;
# no checkpoints. The GRPO baseline on the same steps: bash recipes/arithmetic_grpo/run.sh trainer.total_training_steps=8
# Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."

exec bash recipes/arithmetic_grpo/run.sh \
    'actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}' \
    trainer.total_training_steps=8 \
    trainer.save_freq=-1 \
    trainer.experiment_name=online_dpo_arithmetic \
    "$@"
