#!/usr/bin/env bash
# veRL's GSM8K tool example as written: veRL's own tool YAML (gsm8k_tool_config.yaml, unchanged; its
# class_name verl.tools.gsm8k_tool.Gsm8kTool resolves to hybrid_rl's port when verl is not installed)
# and rows in veRL's gsm8k_multiturn_w_tool layout. The model reasons, checks its answer with
# <tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "..."}}</tool_call> (the reply is
# masked from the loss), and answers after ####. CPU-sized by default (SmolLM2-135M-Instruct, 64
# held-out rows); for veRL's GPU setting pass MODEL_PATH=<local Qwen2.5-0.5B-Instruct> and the sizes
# of recipes/gsm8k_tool/run.sh. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
MODEL_PATH="${MODEL_PATH:-HuggingFaceTB/SmolLM2-135M-Instruct}"
DATA_DIR="${DATA_DIR:-$HOME/.cache/hybrid_rl/gsm8k_verl_tool}"
VAL_ROWS="${VAL_ROWS:-64}"
if [ ! -f "$DATA_DIR/val.parquet" ]; then
    # openai/gsm8k through the datasets cache, or offline the folder GSM8K_DIR (train.jsonl, test.jsonl)
    python scripts/data/gsm8k.py ${GSM8K_DIR:+--input_dir "$GSM8K_DIR"} --local_save_dir "$DATA_DIR" --verl_tool
    python -c "import pyarrow.parquet as pq, sys; t = pq.read_table(sys.argv[1]); pq.write_table(t.slice(0, int(sys.argv[3])), sys.argv[2])" \
        "$DATA_DIR/test.parquet" "$DATA_DIR/val.parquet" "$VAL_ROWS"
fi

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    data.filter_overlong_prompts=true \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/gsm8k_verl_tool/gsm8k_tool_config.yaml \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    trainer.total_training_steps=2 \
    trainer.test_freq=2 \
    trainer.save_freq=2 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=gsm8k_verl_tool \
    "$@"
