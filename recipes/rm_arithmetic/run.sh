#!/usr/bin/env bash
# Reward-model training on the arithmetic task's preference pairs (chosen = the correct worked
# solution; rejected = a wrong final number, truncated reasoning, the right number in an unscored
# form, or wrong-but-consistent arithmetic; 400 training pairs = every kind for each of the 100
# problems of the RL task's split), two epochs, validated on the 200 held-out problems' pairs:
# pairwise accuracy, loss and the score statistics saved with the model.
# The backbone is the embedded SmolLM2-135M-Instruct (pass model.partial_pretrain=<SFT model> to start
# from an SFT export). Export: python -m hybrid_rl.model_merger --local_dir <run>/global_step_50/reward_model
# --target_dir <folder>  (AutoModelForSequenceClassification). docs/rlhf_pipeline.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m hybrid_rl.trainer.main_rm \
    model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \
    optim.lr=1e-5 \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=8 \
    data.max_length=1024 \
    trainer.total_epochs=2 \
    trainer.test_freq=25 \
    trainer.experiment_name=rm_arithmetic \
    "$@"
