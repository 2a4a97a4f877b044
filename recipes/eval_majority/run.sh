#!/usr/bin/env bash
# Evaluate a model with 8 samples per held-out prompt and vote: mean@8, pass@k, best@k and maj@k
# (self-consistency) per data source. MODEL is an HF folder, the embedded model's name or a
# hybrid_rl checkpoint (e.g. checkpoints/hybrid_rl/arithmetic_grpo/global_step_4 after the default
# run). Extra arguments are passed on (e.g. --engine hf, actor_rollout_ref.rollout.val_kwargs.temperature=0.6).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

python -m hybrid_rl.eval \
    --model "${MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}" \
    --n "${N:-8}" \
    --output "${OUTPUT:-checkpoints/eval_majority/$(basename "${MODEL:-base}").json}" \
    custom_reward_function.path=recipes/eval_majority/answer_scorer.py \
    "$@"
