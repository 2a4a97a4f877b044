#!/usr/bin/env bash
# Multi-turn RL on a TextArena game loaded unchanged: SmolLM2-135M-Instruct plays GuessTheNumber-v0
# (1..16, TextArena's 5-turn limit, "The target number is higher/lower." after each guess; TextArena's
# reward: 1 for the number, else 1 - distance/15 of the last guess). Each row is one episode of
# hybrid_rl.hub.textarena.TextArenaEnv run by EnvAgentLoop (agents.yaml); observations are masked, TextArena's
# reward is the row's score. Games (disjoint seeds) are generated into ~/.cache/hybrid_rl/textarena_guess
# on first use. Extra key=value arguments are appended (they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
DATA="${TEXTARENA_DATA:-$HOME/.cache/hybrid_rl/textarena_guess}"
[ -f "$DATA/test.parquet" ] || python -m hybrid_rl.hub.textarena --env_id GuessTheNumber-v0 --out_dir "$DATA" \
    --game_kwargs '{"min_number": 1, "max_number": 16, "max_turns": 5}' \
    --demo_seed 2014 --demo_moves '["[8]", "[12]", "[10]", "[11]"]'

python -m hybrid_rl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=HuggingFaceTB/SmolLM2-135M-Instruct \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=128 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/textarena_env/agents.yaml \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    trainer.total_training_steps=12 \
    trainer.test_freq=4 \
    trainer.save_freq=-1 \
    trainer.logger='[console,jsonl]' \
    trainer.experiment_name=textarena_env \
    "$@"
