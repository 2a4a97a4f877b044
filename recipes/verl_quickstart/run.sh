#!/usr/bin/env bash
# veRL's PPO quickstart command line (docs/start/quickstart.rst of volcengine/verl), pasted unchanged,
# run on a CPU. Only what cannot be the same on a laptop is added after it: the model (the embedded
# SmolLM2-135M-Instruct instead of a hub download of Qwen2.5-0.5B), the sizes of a 2-core CPU, and
# the two overrides hybrid_rl's notices ask for to keep veRL's meaning (PPO with GAE, one response).
#   bash recipes/verl_quickstart/run.sh                   # openai/gsm8k via datasets (GSM8K_DIR=<jsonl folder> offline)
#   bash recipes/verl_quickstart/run.sh trainer.total_training_steps=null   # the whole 15 epochs
# The command below is veRL's list verbatim up to trainer.total_epochs=15; the lines after it are
# the additions (later values win).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -f "$HOME/data/gsm8k/train.parquet" ]; then
    python scripts/data/gsm8k.py ${GSM8K_DIR:+--input_dir "$GSM8K_DIR"} --local_save_dir "$HOME/data/gsm8k"
fi
MODEL=HuggingFaceTB/SmolLM2-135M-Instruct   # embedded: nothing is downloaded
python3 -m hybrid_rl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    critic.optim.lr=1e-5 \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.ppo_micro_batch_size_per_gpu=4 \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.logger=console \
    trainer.val_before_train=False \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=10 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 \
    actor_rollout_ref.model.path="$MODEL" \
    critic.model.path="$MODEL" \
    algorithm.adv_estimator=gae \
    actor_rollout_ref.rollout.n=1 \
    data.train_batch_size=16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    data.max_response_length=256 \
    trainer.total_training_steps=2 \
    trainer.val_at_end=false \
    trainer.experiment_name=verl_quickstart_ppo \
    "$@"
