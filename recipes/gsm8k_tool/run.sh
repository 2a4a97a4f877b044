#!/usr/bin/env bash
# Multi-turn GRPO on GSM8K with the calculator tool, GPU-sized: Qwen2.5-0.5B-Instruct (its chat template
# speaks the hermes <tool_call> format), vLLM rollout. veRL's gsm8k tool-agent example, with hybrid_rl's
# calculator. Nothing is downloaded at run time:
#   MODEL_PATH  a local copy of Qwen/Qwen2.5-0.5B-Instruct (or larger)
#   DATA_DIR    output of: python scripts/data/gsm8k.py --local_save_dir $DATA_DIR --tool_agent (made here
#               when missing: openai/gsm8k through the datasets cache, or the folder GSM8K_DIR offline)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_PATH="${MODEL_PATH:?set MODEL_PATH to a local Qwen2.5-0.5B-Instruct folder}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k_tool}"
NGPUS="${NGPUS:-1}"
[ -f "$DATA_DIR/test.parquet" ] || python scripts/data/gsm8k.py ${GSM8K_DIR:+--input_dir "$GSM8K_DIR"} \
    --local_save_dir "$DATA_DIR" --tool_agent

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=true \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/calculator_agent/tools.yaml \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
    actor_rollout_ref.rollout.multi_turn.max_parallel_calls=4 \
    trainer.device=cuda \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.total_epochs=15 \
    trainer.total_training_steps=null \
    trainer.test_freq=10 \
    trainer.save_freq=20 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=gsm8k_tool \
    "$@"
