#!/usr/bin/env bash
# Supervised fine-tuning of the embedded SmolLM2-135M-Instruct on the arithmetic task's worked
# solutions (`a op b = c` then `#### c`; 100 training problems, the RL task's split), two epochs,
# validated on the 200 held-out problems: the held-out loss and the greedy accuracy judged by the
# rule scorer. veRL's SFT key names. docs/rlhf_pipeline.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m hybrid_rl.trainer.main_sft \
    model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \
    optim.lr=1e-5 \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=4 \
    data.max_length=1024 \
    trainer.total_epochs=2 \
    trainer.test_freq=2 \
    trainer.experiment_name=sft_arithmetic \
    "$@"
