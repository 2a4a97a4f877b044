#!/usr/bin/env bash
# The decoupled run (recipes/async_arithmetic) with partial rollout: the rollout streams prompt groups into
# the experience buffer as each finishes, and a weight push interrupts the requests in flight, which continue
# from the tokens already sampled with the new weights (every token keeps its version and behaviour log-prob).
# docs/async.md, "Partial rollout".
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash recipes/async_arithmetic/run.sh \
    async_training.partial_rollout=true \
    trainer.experiment_name=arithmetic_grpo_partial_rollout \
    "$@"
