#!/usr/bin/env bash
# recipes/calculator_openai with the agent written against Anthropic's Messages API: the same task,
# data, model and GRPO settings, but the agent (calculator_anthropic_agent.py) is official `anthropic`
# client code that calls /v1/messages with the calculator as a tool, runs its tool_use blocks and sends
# tool_result blocks back. hybrid_rl serves the policy on 127.0.0.1 during each rollout and records
# every call's exact token ids. The task is generated into ~/.cache/hybrid_rl/calculator_anthropic on
# first use. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PYTHONPATH="$PWD/recipes/calculator_anthropic${PYTHONPATH:+:$PYTHONPATH}"   # the agent's module, for the rollout workers
DATA="${CALCULATOR_ANTHROPIC_DATA:-$HOME/.cache/hybrid_rl/calculator_anthropic}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.data.calculator --out_dir "$DATA" --num_train 2000 --num_test 200 \
    --agent_name calculator_anthropic

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
    actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/calculator_anthropic/agents.yaml \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=8 \
    trainer.test_freq=4 \
    trainer.save_freq=8 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=calculator_anthropic \
    "$@"
