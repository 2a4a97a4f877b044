#!/usr/bin/env bash
# recipes/calculator_agent trained through the OpenAI-compatible endpoint: the same task, data, model
# and GRPO settings, but the agent is plain OpenAI client code (calculator_openai_agent.py) that calls
# /v1/chat/completions with tools, runs the calculator itself and sends the results back. hybrid_rl
# serves the policy on 127.0.0.1 during each rollout and records every call's exact token ids.
# The task is generated into ~/.cache/hybrid_rl/calculator_openai on first use. Extra key=value
# arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PYTHONPATH="$PWD/recipes/calculator_openai${PYTHONPATH:+:$PYTHONPATH}"   # the agent's module, for the rollout workers
DATA="${CALCULATOR_OPENAI_DATA:-$HOME/.cache/hybrid_rl/calculator_openai}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.data.calculator --out_dir "$DATA" --num_train 2000 --num_test 200 \
    --agent_name calculator_openai

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=256 \
    data.max_response_length=96 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=0.7 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/calculator_openai/agents.yaml \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=8 \
    trainer.test_freq=4 \
    trainer.save_freq=8 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=calculator_openai \
    "$@"
