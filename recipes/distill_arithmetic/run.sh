#!/usr/bin/env bash
# On-policy distillation on the arithmetic task (docs/distillation.md; figures in this folder's README.md):
#   1. the teacher: the default GRPO run (recipes/arithmetic_grpo: 4 steps, ~78% held-out), exported
#      once from its step-4 checkpoint with the merger into a plain HF folder;
#   2. the student: the base SmolLM2-135M-Instruct again, BATCH prompts x 8 samples per step (4),
#      learning rate LR (5e-6), STEPS steps (8), validated on the 200 held-out problems before training
#      and after every step (BATCH=16 LR=1e-5: the teacher run's own settings). MODE picks how it learns:
#        MODE=distill       the teacher's per-token k3 loss alone, no task reward   [default]
#        MODE=distill_task  GRPO on the task reward + the distillation loss (coefficient 1)
#        MODE=distill_topk  the teacher's top-32 forward KL alone (its whole distribution's head)
#        MODE=grpo          GRPO alone (the comparison)
# Every student run has the teacher run's seed, prompts and other settings. A stage that finished is
# not rerun; a killed one resumes. Extra key=value arguments go to the student.
# OUT: where everything is written; each student in $OUT/<MODE>_b<BATCH>_lr<LR>[_seed<SEED>].
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
OUT="${OUT:-checkpoints/distill_arithmetic}"
MODE="${MODE:-distill}"
BATCH="${BATCH:-4}"
LR="${LR:-5e-6}"
STEPS="${STEPS:-8}"
SEED="${SEED:-}"                 # empty: the default run's seeds; N: trainer.seed=N data.seed=N
STUDENT="$OUT/${MODE}_b${BATCH}_lr${LR}${SEED:+_seed$SEED}"
SEEDS=()
[ -z "$SEED" ] || SEEDS=(trainer.seed="$SEED" data.seed="$SEED")

if [ ! -f "$OUT/teacher_hf/config.json" ]; then
    python -m hybrid_rl.trainer.main_ppo trainer.total_training_steps=4 trainer.save_freq=4 \
        trainer.experiment_name=distill_arithmetic-teacher trainer.default_local_dir="$OUT/teacher"
    python -m hybrid_rl.model_merger --local_dir "$OUT/teacher/global_step_4/actor" --target_dir "$OUT/teacher_hf"
fi

case "$MODE" in
distill)
    python -m hybrid_rl.trainer.main_ppo \
        distillation.enabled=true \
        distillation.teacher_models.teacher_model.model_path="$OUT/teacher_hf" \
        distillation.distillation_loss.loss_mode=k3 \
        distillation.distillation_loss.use_task_rewards=false \
        data.train_batch_size="$BATCH" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
        actor_rollout_ref.actor.optim.lr="$LR" trainer.total_training_steps="$STEPS" trainer.test_freq=1 \
        trainer.save_freq="$STEPS" trainer.experiment_name=distill_arithmetic-distill \
        trainer.default_local_dir="$STUDENT" ${SEEDS[@]+"${SEEDS[@]}"} "$@" ;;
distill_task)
    python -m hybrid_rl.trainer.main_ppo \
        distillation.enabled=true \
        distillation.teacher_models.teacher_model.model_path="$OUT/teacher_hf" \
        distillation.distillation_loss.loss_mode=k3 \
        distillation.distillation_loss.use_task_rewards=true \
        distillation.distillation_loss.distillation_loss_coef=1.0 \
        data.train_batch_size="$BATCH" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
        actor_rollout_ref.actor.optim.lr="$LR" trainer.total_training_steps="$STEPS" trainer.test_freq=1 \
        trainer.save_freq="$STEPS" trainer.experiment_name=distill_arithmetic-distill_task \
        trainer.default_local_dir="$STUDENT" ${SEEDS[@]+"${SEEDS[@]}"} "$@" ;;
distill_topk)
    python -m hybrid_rl.trainer.main_ppo \
        distillation.enabled=true \
        distillation.teacher_models.teacher_model.model_path="$OUT/teacher_hf" \
        distillation.distillation_loss.loss_mode=forward_kl_topk \
        distillation.distillation_loss.topk=32 \
        distillation.distillation_loss.use_task_rewards=false \
        data.train_batch_size="$BATCH" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
        actor_rollout_ref.actor.optim.lr="$LR" trainer.total_training_steps="$STEPS" trainer.test_freq=1 \
        trainer.save_freq="$STEPS" trainer.experiment_name=distill_arithmetic-distill_topk \
        trainer.default_local_dir="$STUDENT" ${SEEDS[@]+"${SEEDS[@]}"} "$@" ;;
grpo)
    python -m hybrid_rl.trainer.main_ppo \
        algorithm.adv_estimator=grpo \
        actor_rollout_ref.actor.use_kl_loss=false \
        data.train_batch_size="$BATCH" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
        actor_rollout_ref.actor.optim.lr="$LR" trainer.total_training_steps="$STEPS" trainer.test_freq=1 \
        trainer.save_freq="$STEPS" trainer.experiment_name=distill_arithmetic-grpo \
        trainer.default_local_dir="$STUDENT" ${SEEDS[@]+"${SEEDS[@]}"} "$@" ;;
*)
    echo "MODE=$MODE: use distill, distill_task, distill_topk or grpo" >&2; exit 2 ;;
esac
