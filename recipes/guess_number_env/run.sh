#!/usr/bin/env bash
# Multi-step RL in a text environment on CPU: SmolLM2-135M-Instruct plays guess-the-number (1..16, at
# most 5 guesses, "Higher."/"Lower." after each; reward 1 for finding it). Each row is one episode of
# the built-in guess_number environment run by EnvAgentLoop (agents.yaml); observations are masked,
# the environment's return is the row's score. Games are generated into ~/.cache/hybrid_rl/guess_number
# on first use. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
DATA="${GUESS_NUMBER_DATA:-$HOME/.cache/hybrid_rl/guess_number}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.data.guess_number --out_dir "$DATA"

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=320 \
    data.max_response_length=96 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/guess_number_env/agents.yaml \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=16 \
    trainer.test_freq=4 \
    trainer.save_freq=8 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=guess_number_env \
    "$@"
