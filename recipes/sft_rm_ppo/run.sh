#!/usr/bin/env bash
# The classic RLHF pipeline on the embedded SmolLM2-135M-Instruct and the arithmetic task, three stages
# on the same engine (docs/rlhf_pipeline.md, figures in this folder's README.md):
#   1. SFT (main_sft): one epoch on the 100 worked solutions (zero-shot prompts), lr 5e-6: a light SFT
#      that teaches the answer format to part of the problems;
#   2. reward model (main_rm) on the SFT model: Bradley-Terry, two epochs over the 400 training pairs
#      (each of the 100 problems with every rejected kind);
#   3. GRPO (main_ppo) from the SFT model with the reward model as the ONLY reward
#      (reward_model.rm_weight=1, rule_weight=0), KL loss 0.01, 8 steps; the rule scorer only judges:
#      critic/rule_score/mean beside critic/rm_score/mean in training, and the held-out greedy accuracy
#      in validation. Longer runs over-optimise the reward model (README.md: how it shows).
# Each stage resumes from its last checkpoint when the script is run again after a kill; a stage that
# finished is not rerun. Extra arguments go to the GRPO stage. OUT: where everything is written.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-checkpoints/sft_rm_ppo}"

latest() {  # the newest complete checkpoint of a run folder
    echo "$1/global_step_$(cat "$1/latest_checkpointed_iteration.txt")"
}

export_hf() {  # export_hf <run folder> <actor|reward_model> <target>: once, from its final checkpoint
    [ -f "$3/config.json" ] || python -m hybrid_rl.model_merger --local_dir "$(latest "$1")/$2" --target_dir "$3"
}

if [ ! -f "$OUT/sft_hf/config.json" ]; then
    python -m hybrid_rl.trainer.main_sft \
        model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \
        optim.lr=5e-6 data.train_batch_size=16 data.micro_batch_size_per_gpu=4 \
        trainer.total_epochs=1 trainer.test_freq=6 trainer.save_freq=6 \
        trainer.experiment_name=sft_rm_ppo-sft trainer.default_local_dir="$OUT/sft"
    export_hf "$OUT/sft" actor "$OUT/sft_hf"
fi

if [ ! -f "$OUT/rm_hf/config.json" ]; then
    python -m hybrid_rl.trainer.main_rm \
        model.partial_pretrain="$OUT/sft_hf" \
        optim.lr=1e-5 data.train_batch_size=16 data.micro_batch_size_per_gpu=8 \
        trainer.total_epochs=2 trainer.test_freq=25 trainer.save_freq=25 \
        trainer.experiment_name=sft_rm_ppo-rm trainer.default_local_dir="$OUT/rm"
    export_hf "$OUT/rm" reward_model "$OUT/rm_hf"
fi

python -m hybrid_rl.trainer.main_ppo \
    actor_rollout_ref.model.path="$OUT/sft_hf" \
    reward_model.enable=true \
    reward_model.model.path="$OUT/rm_hf" \
    reward_model.rm_weight=1.0 \
    reward_model.rule_weight=0.0 \
    data.arithmetic.num_shots=0 \
    data.train_batch_size=16 \
    data.max_prompt_length=128 \
    data.max_response_length=16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=0.8 \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    trainer.total_training_steps=8 \
    trainer.test_freq=2 \
    trainer.save_freq=4 \
    trainer.experiment_name=sft_rm_ppo-grpo \
    trainer.default_local_dir="$OUT/grpo" \
    "$@"
