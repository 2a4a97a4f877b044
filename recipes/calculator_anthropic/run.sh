#!/usr/bin/env bash
# recipes/calculator_openai with the agent written against Anthropic's Messages API: the same task,
# data, model and GRPO settings, but the agent (calculator_anthropic_agent.py) is official `anthropic`
# client code that calls /v1/messages with the calculator as a tool, runs its tool_use blocks and sends
# tool_result blocks back. hybrid_rl serves the policy on 127.0.0.1 during each rollout and records
# every call's exact token ids. The task is generated into ~/.cache/hybrid_rl/calculator_anthropic on
# first use. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/recipes/calculator_anthropic${PYTHONPATH:+:$PYTHONPATH}"   # the agent's module, for the rollout workers
DATA="${CALCULATOR_ANTHROPIC_DATA:-$HOME/.cache/hybrid_rl/calculator_anthropic}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.data.calculator --out_dir "$DATA" --num_train 2000 --num_test 200 \
    --agent_name calculator_anthropic

# recipes/calculator_openai's settings, with this recipe's rows (its data step is then skipped), agent and name
export CALCULATOR_OPENAI_DATA="$DATA"
exec bash recipes/calculator_openai/run.sh \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/calculator_anthropic/agents.yaml \
    trainer.experiment_name=calculator_anthropic \
    "$@"
