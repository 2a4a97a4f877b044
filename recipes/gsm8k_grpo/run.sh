#!/usr/bin/env bash
# GRPO on GSM8K, GPU-sized: Qwen2.5-0.5B-Instruct, vLLM rollout, 2 GPUs (scale n_gpus_per_node).
# Settings follow veRL's Qwen2.5-0.5B GSM8K examples. Nothing is downloaded at run time:
#   MODEL_PATH  a local copy of Qwen/Qwen2.5-0.5B-Instruct (huggingface-cli download beforehand)
#   DATA_DIR    output of: python scripts/data/gsm8k.py --local_save_dir $DATA_DIR (openai/gsm8k through
#               the datasets cache; --input_dir <folder with train.jsonl, test.jsonl> offline)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_PATH="${MODEL_PATH:?set MODEL_PATH to a local Qwen2.5-0.5B-Instruct folder}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
NGPUS="${NGPUS:-2}"

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=true \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.fsdp_config.param_offload=true \
    trainer.device=cuda \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=15 \
    trainer.total_training_steps=null \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.val_before_train=true \
    trainer.logger='[console,jsonl,tensorboard]' \
    trainer.project_name=hybrid_rl_gsm8k \
    trainer.experiment_name=qwen2.5_0.5b_grpo \
    "$@"
