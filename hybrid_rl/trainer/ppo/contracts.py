"""The PPO family's step plan and each step's batch keys (:mod:`hybrid_rl.trainer.core.batch_contract`).

:func:`ppo_batch_plan` is where the config decides which steps run (an estimator's greedy baseline,
a learned reward model, dynamic sampling, the old-log-prob pass or the rollout's log-probs, the
reference, the teachers, the critic, the rollout correction) and what each reads and writes;
:meth:`RayPPOTrainer.step_plan` is its step names, the actor update dropped during the critic's
warm-up, then the cadence. :func:`decoupled_batch_plan` is the decoupled mode's: the experience
buffer gives the scored rollout, and the new weights are pushed to the rollout pool.

The actor update's keys are what its objective declares (:func:`actor_update_contract`). An actor
objective whose rows come in pairs (online DPO, :mod:`hybrid_rl.trainer.ppo.paired`) gets
:func:`paired_update_steps` after the scoring: ``build_pairs -> [compute_ref_log_prob] -> update_actor``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hybrid_rl.algorithms.distillation import distillation_loss_info
from hybrid_rl.objectives import Objective
from hybrid_rl.workers.objective_choice import actor_objective
from hybrid_rl.schema import SCHEMA_BY_NAME
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core.batch_contract import BatchPlan, StepContract
from hybrid_rl.trainer.ppo.paired import objective_needs_reference, paired_objective
from hybrid_rl.workers.config import update_is_on_policy

__all__ = ["MODEL_INPUTS", "actor_update_contract", "decoupled_batch_plan", "needs_old_log_prob_pass",
           "paired_update_steps", "ppo_batch_plan"]

OWNER = "hybrid_rl/trainer/ppo/contracts.py"
PROMPT_INPUTS = ("input_ids", "attention_mask", "position_ids")
"""The prompt dataset's collate: left-padded prompt tensors [B, P] (its columns are optional)."""
MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")
"""What a forward over the rollout's sequences reads."""
ROLLOUT = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
"""What every rollout engine returns (``rollout_log_probs`` too with ``rollout.calculate_log_probs``)."""
PROMPT_COLUMNS = ("raw_prompt", "agent_name", "extra_info", "data_source", "reward_model", "index")
SCORER_READS = ("prompts", "attention_mask", "response_mask", "rm_scores", "rm_raw_scores", "data_source",
                "reward_model", "extra_info", "reward_score", "num_turns", "tool_rewards", "turn_scores")


def needs_old_log_prob_pass(cfg: Any, correction: Any) -> bool:
    """Whether the actor's log-probs are recomputed before the update (``compute_old_log_prob``): an
    off-policy update, the in-reward KL or a measured rollout correction need them; an exactly
    on-policy update uses its own detached log-probs (bypass mode takes the rollout's instead)."""
    on_policy = update_is_on_policy(cfg.actor_rollout_ref.actor, cfg.data.train_batch_size)
    return correction.measured or not (on_policy and not cfg.algorithm.use_kl_in_reward)


def actor_update_contract(cfg: Any, old_log_probs: bool, correction: Any) -> StepContract:
    """``update_actor``: the model inputs and what the actor's objective declares it reads
    (:func:`hybrid_rl.workers.objective_choice.actor_objective`, built as the actor worker builds it:
    the objective ``actor.objective`` selects, else the policy loss, entropy, KL loss and distillation terms). ``old_log_probs``: an earlier step writes them (else
    the update is on-policy and uses its own detached log-probs); ``correction``: the resolved
    ``algorithm.rollout_correction`` (bypass mode's loss reads the rollout's log-probs)."""
    distillation = cfg.distillation.distillation_loss if cfg.distillation.enabled else None
    objective = actor_objective(cfg.actor_rollout_ref.actor, distillation)
    if correction.bypass_mode:
        objective.bind({"rollout_correction": asdict(correction)})
    on_policy = not old_log_probs
    reads = tuple(objective.required_keys(on_policy))
    optional = [k for k in objective.input_keys(SCHEMA_BY_NAME, on_policy) if k not in reads]
    return StepContract("update_actor", MODEL_INPUTS + tuple(k for k in reads if k not in MODEL_INPUTS),
                        tuple(optional))


def _rollout_writes(cfg: Any) -> tuple[str, ...]:
    return ROLLOUT + (("rollout_log_probs",) if cfg.actor_rollout_ref.rollout.calculate_log_probs else ())


def _scoring_steps(cfg: Any, plan: RunPlan) -> list[StepContract]:
    """generate -> [compute_reward_baseline] -> [compute_rm_score] -> compute_reward -> [filter_groups]."""
    steps = [StepContract("generate", PROMPT_INPUTS, PROMPT_COLUMNS, _rollout_writes(cfg) + ("uid",))]
    if plan.use_greedy_baseline:
        steps.append(StepContract("compute_reward_baseline", ("prompts", "attention_mask", "position_ids"),
                                  PROMPT_COLUMNS, ("reward_baselines",)))
    if cfg.reward_model.enable:
        steps.append(StepContract("compute_rm_score", ("responses", "attention_mask"),
                                  ("prompts", "raw_prompt", "rm_input_ids", "rm_attention_mask", "rm_position_ids"),
                                  ("rm_scores", "rm_raw_scores")))
    steps.append(StepContract("compute_reward", ("responses",), SCORER_READS, ("token_level_scores",)))
    if cfg.algorithm.filter_groups.enable:
        steps.append(StepContract("filter_groups", ("uid",), ("token_level_scores",)))
    return steps


def _log_prob_steps(cfg: Any, plan: RunPlan, correction: Any) -> list[StepContract]:
    """[compute_old_log_prob | use_rollout_log_probs] -> [compute_ref_log_prob] -> [compute_teacher_log_prob]
    -> [compute_values] -> [compute_rollout_correction]."""
    recompute = needs_old_log_prob_pass(cfg, correction)
    steps = []
    if correction.bypass_mode:
        steps.append(StepContract("use_rollout_log_probs", ("rollout_log_probs",), (), ("old_log_probs",)))
    elif recompute:
        steps.append(StepContract("compute_old_log_prob", MODEL_INPUTS + ("response_mask",), (), ("old_log_probs",)))
    if plan.use_reference_policy:
        steps.append(StepContract("compute_ref_log_prob", MODEL_INPUTS, (), ("ref_log_prob",)))
    if cfg.distillation.enabled:
        topk = distillation_loss_info(cfg.distillation.distillation_loss.loss_mode).use_topk
        steps.append(StepContract("compute_teacher_log_prob", MODEL_INPUTS, PROMPT_COLUMNS, (
            "teacher_log_prob",) + (("teacher_topk_log_probs", "teacher_topk_ids") if topk else ())))
    if plan.use_critic:
        steps.append(StepContract("compute_values", MODEL_INPUTS + ("response_mask",), (), ("values",)))
    if not correction.bypass_mode and recompute and cfg.actor_rollout_ref.rollout.calculate_log_probs:
        # weights and rejections, or the mismatch metrics only
        steps.append(StepContract("compute_rollout_correction", ("old_log_probs", "rollout_log_probs", "response_mask"),
                                  (), ("response_mask",)))
    return steps


def _update_steps(cfg: Any, plan: RunPlan, old_log_probs: bool, correction: Any) -> list[StepContract]:
    """compute_advantage -> [update_critic] -> update_actor."""
    reads = ["token_level_scores", "response_mask"]
    if cfg.algorithm.use_kl_in_reward:
        reads += ["old_log_probs", "ref_log_prob"]
    if plan.use_critic:
        reads.append("values")
    if plan.use_greedy_baseline:
        reads.append("reward_baselines")
    steps = [StepContract("compute_advantage", tuple(reads), ("uid", "values", "reward_baselines"),
                          ("token_level_rewards", "advantages", "returns"))]
    if plan.use_critic:
        steps.append(StepContract("update_critic", MODEL_INPUTS + ("response_mask", "values", "returns")))
    return steps + [actor_update_contract(cfg, old_log_probs, correction)]


def _dump_steps(cfg: Any) -> list[StepContract]:
    """``dump_rollout`` (``trainer.rollout_data_dir``): the step's rows, scored, with their
    log-probs and advantages, in veRL's JSONL and our sidecar (:mod:`hybrid_rl.trainer.core.dumps`)."""
    if cfg.trainer.rollout_data_dir is None:
        return []
    return [StepContract("dump_rollout", ("prompts", "responses", "attention_mask", "response_mask",
                                          "token_level_scores"))]


def paired_update_steps(objective: Objective) -> list[StepContract]:
    """``build_pairs -> [compute_ref_log_prob] -> update_actor`` for a paired actor objective: the
    pairs batch holds the rollout's keys, re-ordered (rows 2i chosen, 2i+1 rejected)."""
    steps = [StepContract("build_pairs", ("token_level_scores", "uid"), (),
                          ROLLOUT + ("token_level_scores", "uid"))]
    if objective_needs_reference(objective):
        steps.append(StepContract("compute_ref_log_prob", MODEL_INPUTS, (), ("ref_log_prob",)))
    reads = tuple(k for k in objective.required_keys() if k not in MODEL_INPUTS)
    optional = tuple(k for k in objective.optional_reads if k not in reads)
    return steps + [StepContract("update_actor", MODEL_INPUTS + reads, optional)]


def ppo_batch_plan(cfg: Any, plan: RunPlan, correction: Any) -> BatchPlan:
    """Every step of a PPO training step in running order, with its keys (``correction``: the
    resolved ``algorithm.rollout_correction``)."""
    paired = paired_objective(cfg)
    if paired is not None:  # online DPO: no old log-probs, advantages or critic
        steps = _scoring_steps(cfg, plan) + paired_update_steps(paired) + _dump_steps(cfg)
        return BatchPlan(StepContract("dataset collate", writes=PROMPT_INPUTS), tuple(steps), OWNER)
    log_prob_steps = _log_prob_steps(cfg, plan, correction)
    old_log_probs = any("old_log_probs" in step.writes for step in log_prob_steps)
    steps = (_scoring_steps(cfg, plan) + log_prob_steps + _update_steps(cfg, plan, old_log_probs, correction)
             + _dump_steps(cfg))
    return BatchPlan(StepContract("dataset collate", writes=PROMPT_INPUTS), tuple(steps), OWNER)


def decoupled_batch_plan(ppo: BatchPlan, cfg: Any) -> BatchPlan:
    """The decoupled mode's plan from the colocated one: ``take_experiences`` (the producer's scored
    rows from the experience buffer) instead of generating and scoring, then the same steps, then
    ``sync_rollout_weights``."""
    replaced = ("generate", "compute_rm_score", "compute_reward")
    # rollout_versions is there only when a row's tokens came from several versions (the buffer stores it compactly)
    spans = ("min_global_steps", "max_global_steps") + (("rollout_group",) if cfg.async_training.partial_rollout else ())
    take = StepContract("take_experiences", writes=_rollout_writes(cfg) + (
        "token_level_scores", "uid", "data_source", "reward_model", "policy_version") + spans)
    steps = (take,) + tuple(s for s in ppo.steps if s.name not in replaced) + (StepContract("sync_rollout_weights"),)
    return BatchPlan(StepContract("experience buffer"), steps, OWNER)
