#!/usr/bin/env bash
# Agentic GRPO on CPU: SmolLM2-135M-Instruct learns to multiply a 3-digit by a 2-digit number with a
# calculator tool (multi-turn rollout: call -> tool result -> answer). The task is generated into
# ~/.cache/hybrid_rl/calculator on first use. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
DATA="${CALCULATOR_DATA:-$HOME/.cache/hybrid_rl/calculator}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.data.calculator --out_dir "$DATA" --num_train 2000 --num_test 200

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
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/calculator_agent/tools.yaml \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=8 \
    trainer.test_freq=4 \
    trainer.save_freq=8 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=calculator_agent \
    "$@"
