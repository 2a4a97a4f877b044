#!/usr/bin/env bash
# Offline DPO on the arithmetic task's preference pairs, from a light SFT of the embedded
# SmolLM2-135M-Instruct (figures in this folder's README.md):
#   1. SFT (main_sft): one epoch on the 100 worked solutions (zero-shot prompts), lr 5e-6, as the first
#      stage of recipes/sft_rm_ppo: a light SFT that teaches the answer format to part of the problems;
#   2. DPO (main_dpo) from the SFT model, its frozen copy the reference: TRL's sigmoid loss, beta 0.1,
#      16 pairs per step over the 400 training pairs (each of the 100 problems with every rejected kind:
#      wrong number, truncated, unscored format, wrong-but-consistent arithmetic). Validated every 4
#      steps on the 200 held-out problems: their pairs (val/dpo/rewards/accuracies, margins, loss) and
#      their prompts (val-core/arithmetic/reward/mean@1: the greedy answers judged by the rule scorer);
#      step 0 is the SFT start.
# The SFT stage is skipped when its export exists. Extra arguments go to the DPO stage. OUT: where
# everything is written.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-checkpoints/dpo_arithmetic}"

if [ ! -f "$OUT/sft_hf/config.json" ]; then
    python -m hybrid_rl.trainer.main_sft \
        model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \
        optim.lr=5e-6 data.train_batch_size=16 data.micro_batch_size_per_gpu=4 \
        trainer.total_epochs=1 trainer.val_before_train=false trainer.test_freq=7 trainer.save_freq=7 \
        trainer.experiment_name=dpo_arithmetic-sft trainer.default_local_dir="$OUT/sft"
    python -m hybrid_rl.model_merger \
        --local_dir "$OUT/sft/global_step_$(cat "$OUT/sft/latest_checkpointed_iteration.txt")/actor" \
        --target_dir "$OUT/sft_hf"
fi

python -m hybrid_rl.trainer.main_dpo \
    model.partial_pretrain="$OUT/sft_hf" \
    dpo.beta=0.1 \
    dpo.loss_type=sigmoid \
    optim.lr=5e-6 \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=4 \
    trainer.total_training_steps=12 \
    trainer.test_freq=4 \
    trainer.save_freq=12 \
    trainer.experiment_name=dpo_arithmetic \
    trainer.default_local_dir="$OUT/dpo" \
    "$@"
