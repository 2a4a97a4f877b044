#!/usr/bin/env bash
# PPO (GAE + critic) on GSM8K: Qwen2.5-0.5B-Instruct actor and critic, vLLM rollout, 2 GPUs.
# Same data and model preparation as recipes/gsm8k_grpo (MODEL_PATH, DATA_DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_PATH="${MODEL_PATH:?set MODEL_PATH to a local Qwen2.5-0.5B-Instruct folder}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
NGPUS="${NGPUS:-2}"

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=1.0 \
    algorithm.use_kl_in_reward=false \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=true \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    critic.model.path="$MODEL_PATH" \
    critic.model.enable_gradient_checkpointing=true \
    critic.model.use_remove_padding=true \
    critic.optim.lr=1e-5 \
    critic.ppo_micro_batch_size_per_gpu=8 \
    critic.cliprange_value=0.5 \
    trainer.critic_warmup=0 \
    trainer.device=cuda \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=15 \
    trainer.total_training_steps=null \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.logger='[console,jsonl,tensorboard]' \
    trainer.project_name=hybrid_rl_gsm8k \
    trainer.experiment_name=qwen2.5_0.5b_ppo \
    "$@"
