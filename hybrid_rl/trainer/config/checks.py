"""One validation pass over the composed PPO config, and the values derived from it.

:func:`validate_config` starts from the checks every mode shares (:mod:`hybrid_rl.trainer.config.run_checks`)
and checks what no single group can check alone (batch sizes against the
number of workers, ``rollout.n`` against the estimator, a critic for GAE, files on disk, ...).
Every problem is one line naming the keys, their values and the fix; all problems are reported
together in one ``ValueError``. Derived values go into :class:`RunPlan`; the config is never
rewritten.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Callable

from hybrid_rl.trainer.config.agent_rows_checks import check_agent_rows
from hybrid_rl.trainer.config.paired_checks import check_paired_objective, objective_needs_reference, paired_objective
from hybrid_rl.trainer.config.reward_model import is_remote
from hybrid_rl.trainer.config.run_checks import (RunPlan, as_file_list, check_data_files, check_devices,
                                                 check_model_path, check_trainer, file_problem,
                                                 raise_problems, run_dir, worker_layout, world_size_problems)
from hybrid_rl.trainer.config.schema import PPOConfig
from hybrid_rl.utils.bounds import bound_problems
from hybrid_rl.utils.devices import DEVICES, resolve_device

__all__ = ["RunPlan", "as_file_list", "estimator_needs", "estimators_where", "loss_needs", "make_run_plan",
           "resume_point_problems", "run_dir", "validate_config"]

if TYPE_CHECKING:
    from hybrid_rl.algorithms import AdvEstimatorInfo, PolicyLossInfo


def estimator_needs(cfg: PPOConfig) -> "AdvEstimatorInfo":
    """What ``algorithm.adv_estimator`` needs (its registry info); an unregistered name needs nothing
    here (:func:`validate_config` reports it)."""
    from hybrid_rl.algorithms import AdvEstimatorInfo, adv_estimator_info, registered_adv_estimators

    name = cfg.algorithm.adv_estimator
    return adv_estimator_info(name) if name in registered_adv_estimators() else AdvEstimatorInfo()


def loss_needs(cfg: PPOConfig) -> "PolicyLossInfo":
    """What ``actor.policy_loss.loss_mode`` needs (its registry info); nothing when unregistered."""
    from hybrid_rl.algorithms import PolicyLossInfo, policy_loss_info, registered_policy_losses

    name = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    return policy_loss_info(name) if name in registered_policy_losses() else PolicyLossInfo()


def make_run_plan(cfg: PPOConfig) -> RunPlan:
    """Derived values (call after :func:`validate_config`)."""
    actor = cfg.actor_rollout_ref.actor
    decoupled = cfg.async_training.enable
    teachers = cfg.distillation.pool_size
    per_node = (cfg.trainer.n_gpus_per_node + (cfg.rollout.n_gpus_per_node if decoupled else 0)
                + (cfg.distillation.n_gpus_per_node if teachers else 0))
    device, world, threads = worker_layout(cfg, per_node)
    needs = estimator_needs(cfg)
    paired = paired_objective(cfg)  # online DPO: no estimator runs, the objective may read the reference
    reference = paired is not None and objective_needs_reference(paired)
    return RunPlan(
        device=device,
        world_size=world,
        use_critic=needs.needs_critic and paired is None,
        use_reference_policy=cfg.algorithm.use_kl_in_reward or actor.use_kl_loss or reference,
        threads_per_worker=threads,
        rollout_world_size=cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if decoupled else 0,
        teacher_world_size=teachers,
        use_reward_model=cfg.reward_model.enable and not is_remote(cfg.reward_model.model.path),
        single_process=cfg.trainer.single_process is True,
        use_greedy_baseline=needs.needs_greedy_baseline and paired is None,
    )


def validate_config(cfg: PPOConfig, *, training: bool = True) -> None:
    """Raise one ValueError listing every inconsistency of ``cfg`` (each line: keys, values, fix).

    ``training=False`` (``python -m hybrid_rl.eval`` / ``debug``: generate and score, no update) skips
    what only an update uses: the mini/micro-batch sizes and token budgets. The run folder and the resume
    point are the runtime's (:mod:`hybrid_rl.trainer.core.runtime_checks`, with :func:`resume_point_problems`)."""
    errors = bound_problems(cfg)  # every field's declared range (hybrid_rl.utils.bounds)
    checks = [_check_devices, _check_lengths, _check_algorithm, _check_dapo, _check_files, _check_trainer,
              _check_reward, _check_async, _check_distillation, check_paired_objective, check_agent_rows]
    checks += [_check_batch_sizes] if training else []
    for check in checks:
        errors.extend(check(cfg))
    raise_problems(errors)


def _check_distillation(cfg: PPOConfig) -> list[str]:
    from hybrid_rl.trainer.config.distillation_checks import check_distillation as check

    return check(cfg)


def _check_trainer(cfg: PPOConfig) -> list[str]:
    """The core's ``trainer.*`` checks, and RL's own checkpoint key."""
    t, errors = cfg.trainer, check_trainer(cfg)
    if t.max_critic_ckpt_to_keep not in (None, t.max_actor_ckpt_to_keep):
        errors.append(
            f"trainer.max_critic_ckpt_to_keep={t.max_critic_ckpt_to_keep} differs from trainer.max_actor_ckpt_to_keep="
            f"{t.max_actor_ckpt_to_keep}: actor and critic share one step folder; set it to null."
        )
    return errors


def _check_devices(cfg: PPOConfig) -> list[str]:
    """The shared device checks, and the rollout's tensor parallelism against the workers."""
    errors = check_devices(cfg)
    t, tp = cfg.trainer, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if t.device in DEVICES and tp > 1 and t.n_gpus_per_node % tp != 0:
        errors.append(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide "
            f"trainer.n_gpus_per_node={t.n_gpus_per_node}; change one of them."
        )
    return errors


def _divides(rows: int, by: int) -> bool:
    return by > 0 and rows % by == 0


def _check_batch_sizes(cfg: PPOConfig) -> list[str]:
    t, data, arr = cfg.trainer, cfg.data, cfg.actor_rollout_ref
    world = max(1, t.nnodes * t.n_gpus_per_node)
    n = arr.rollout.n
    errors = []
    if n < 1 or data.train_batch_size < 1:
        return []  # below their declared bounds (reported with them)
    rows = data.train_batch_size * n
    if not _divides(rows, world):
        errors.append(
            f"data.train_batch_size ({data.train_batch_size}) * rollout.n ({n}) = {rows} rows is not divisible by "
            f"the {world} workers (trainer.nnodes * trainer.n_gpus_per_node); change the batch size or the worker count."
        )
    groups = [("actor_rollout_ref.actor", arr.actor)]
    needs_critic = estimator_needs(cfg).needs_critic
    if needs_critic:
        groups.append(("critic", cfg.critic))
    for prefix, group in groups:
        errors.extend(_check_group_batches(prefix, group, data.train_batch_size, n, world))
    errors.extend(_check_token_budgets(cfg, groups))
    if cfg.critic.rollout_n != n and needs_critic:
        errors.append(
            f"critic.rollout_n={cfg.critic.rollout_n} differs from actor_rollout_ref.rollout.n={n}; "
            "leave critic.rollout_n at its default (${actor_rollout_ref.rollout.n})."
        )
    return errors


def _check_lengths(cfg: PPOConfig) -> list[str]:
    """The rollout's lengths are the data's (the engine's context and the batch widths agree)."""
    data, rollout = cfg.data, cfg.actor_rollout_ref.rollout
    return [f"actor_rollout_ref.rollout.{rollout_key}={getattr(rollout, rollout_key)} differs from "
            f"data.{data_key}={getattr(data, data_key)}; set only data.{data_key} "
            f"(rollout.{rollout_key} follows it by default)."
            for data_key, rollout_key in (("max_response_length", "response_length"),
                                          ("max_prompt_length", "prompt_length"))
            if getattr(data, data_key) != getattr(rollout, rollout_key)]


def _check_token_budgets(cfg: PPOConfig, groups: list[tuple[str, Any]]) -> list[str]:
    """Dynamic batching needs a token budget that fits the longest possible row; caught here it
    is an error before start-up instead of a crash at the first long row."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    ref = cfg.actor_rollout_ref.ref
    budgets = [(f"{prefix}.ppo_max_token_len_per_gpu", g.use_dynamic_bsz, g.ppo_max_token_len_per_gpu)
               for prefix, g in groups]
    actor = cfg.actor_rollout_ref.actor
    uses_ref = actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    if uses_ref and ref.log_prob_max_token_len_per_gpu != actor.ppo_max_token_len_per_gpu:  # else reported once
        budgets.append(("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", ref.log_prob_use_dynamic_bsz,
                        ref.log_prob_max_token_len_per_gpu))
    return [f"{key}={budget} is smaller than one row of up to {longest} tokens (data.max_prompt_length + "
            f"data.max_response_length); raise it to at least {longest}."
            for key, dynamic, budget in budgets if dynamic and budget < longest]


def _check_group_batches(prefix: str, group: Any, train_batch_size: int, n: int, world: int) -> list[str]:
    mini = group.ppo_mini_batch_size
    if mini < 1:
        return []  # the group's own __post_init__ reports it
    errors = []
    if mini > train_batch_size or train_batch_size % mini != 0:
        errors.append(
            f"data.train_batch_size ({train_batch_size}) must be a multiple of {prefix}.ppo_mini_batch_size ({mini}) "
            f"(prompts per optimizer step); set {prefix}.ppo_mini_batch_size to a divisor of {train_batch_size}."
        )
    mini_rows = mini * n
    if mini_rows % world != 0:
        if mini == train_batch_size:
            return errors  # same rows as the whole batch: already reported by the caller
        errors.append(
            f"{prefix}.ppo_mini_batch_size ({mini}) * rollout.n ({n}) = {mini_rows} rows is not divisible by the "
            f"{world} workers; change {prefix}.ppo_mini_batch_size or trainer.n_gpus_per_node."
        )
    elif not group.use_dynamic_bsz and group.ppo_micro_batch_size is not None \
            and group.ppo_micro_batch_size % world != 0:
        errors.append(
            f"{prefix}.ppo_micro_batch_size ({group.ppo_micro_batch_size}, veRL's global micro-batch) must divide over "
            f"the {world} workers; set {prefix}.ppo_micro_batch_size_per_gpu instead.")
    elif not group.use_dynamic_bsz and (group.ppo_micro_batch_size or group.ppo_micro_batch_size_per_gpu):
        micro = (group.ppo_micro_batch_size // world if group.ppo_micro_batch_size is not None
                 else group.ppo_micro_batch_size_per_gpu)
        per_rank = mini_rows // world
        # A micro-batch larger than the rank's mini-batch is just one micro-batch.
        if micro < per_rank and per_rank % micro != 0:
            errors.append(
                f"{prefix}.ppo_micro_batch_size_per_gpu ({micro}) must divide the {per_rank} rows each worker gets per "
                f"mini-batch ({prefix}.ppo_mini_batch_size {mini} * n {n} / {world} workers); use a divisor of {per_rank}."
            )
    return errors


def estimators_where(predicate: Callable[[Any], bool]) -> str:
    """The registered estimators whose info satisfies ``predicate``, as 'a or b' for a fix-it message."""
    from hybrid_rl.algorithms import describe_adv_estimators

    names = [name for name, info in describe_adv_estimators().items() if predicate(info)]
    return " or ".join(names) if names else "none registered"


def _check_algorithm(cfg: PPOConfig) -> list[str]:
    from hybrid_rl.algorithms import KL_PENALTY_TYPES

    alg = cfg.algorithm
    errors = _check_estimator(cfg) + _check_policy_loss(cfg) + _check_rollout_correction(cfg)
    if alg.kl_penalty not in KL_PENALTY_TYPES:
        errors.append(
            f"algorithm.kl_penalty={alg.kl_penalty!r} is not one of {list(KL_PENALTY_TYPES)}; set one of them "
            "(low_var_kl = k3 is the usual choice)."
        )
    if alg.kl_ctrl.type not in ("fixed", "adaptive"):
        errors.append(f"algorithm.kl_ctrl.type={alg.kl_ctrl.type!r} must be fixed or adaptive.")
    return errors


def _check_estimator(cfg: PPOConfig) -> list[str]:
    """``algorithm.adv_estimator`` is registered and the run gives it what its registry info says it needs."""
    from hybrid_rl.algorithms import registered_adv_estimators

    from hybrid_rl.algorithms.advantage_variants import UNSUPPORTED_ADV_ESTIMATORS
    from hybrid_rl.trainer.config.schema import key_owner

    name, n, needs = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n, estimator_needs(cfg)
    if name in UNSUPPORTED_ADV_ESTIMATORS and name not in registered_adv_estimators():
        nearest, why = UNSUPPORTED_ADV_ESTIMATORS[name]
        return [f"algorithm.adv_estimator={name} (veRL's) is not available in hybrid_rl: {why}. Nearest: "
                f"algorithm.adv_estimator={nearest}."]
    if name not in registered_adv_estimators():
        return [f"algorithm.adv_estimator={name!r} is not registered; valid: {registered_adv_estimators()}."]
    errors = [f"algorithm.adv_estimator={name} needs {key} set (it is {getattr(*key_owner(cfg, key))!r}); e.g. "
              f"{key}=[acc,format]." for key in needs.requires if not getattr(*key_owner(cfg, key))]
    keys, weights = cfg.algorithm.gdpo_reward_keys, cfg.algorithm.gdpo_reward_weights
    if weights is not None and not all(math.isfinite(w) for w in weights):
        errors.append(f"algorithm.gdpo_reward_weights={list(weights)} is invalid: must be finite numbers. Fix: use "
                      "e.g. [1.0, 0.5], or null (1 each).")
    if keys and weights is not None and len(weights) != len(keys):
        errors.append(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)} "
                      f"algorithm.gdpo_reward_keys {list(keys)}; give one weight per key (or null for 1 each).")
    if needs.needs_groups and n < 2:
        errors.append(
            f"algorithm.adv_estimator={name} compares the responses to the same prompt but "
            f"actor_rollout_ref.rollout.n={n}; set rollout.n >= 2 (e.g. 8), or use an estimator with a critic "
            f"({estimators_where(lambda i: i.needs_critic)})."
        )
    if cfg.trainer.critic_warmup > 0 and not needs.needs_critic:
        errors.append(
            f"trainer.critic_warmup={cfg.trainer.critic_warmup} but algorithm.adv_estimator={name} trains no "
            f"critic; set trainer.critic_warmup=0 or an estimator with a critic ({estimators_where(lambda i: i.needs_critic)})."
        )
    if needs.needs_critic:
        errors.extend(check_model_path("critic.model.path", cfg.critic.model.path))
    return errors


def _check_policy_loss(cfg: PPOConfig) -> list[str]:
    """``actor.policy_loss.loss_mode`` is registered and gets what its registry info says it needs."""
    from hybrid_rl.algorithms import registered_policy_losses

    name = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if name not in registered_policy_losses():
        return [f"actor_rollout_ref.actor.policy_loss.loss_mode={name!r} is not registered; "
                f"valid: {registered_policy_losses()}."]
    if loss_needs(cfg).needs_rollout_log_probs and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        return [f"actor_rollout_ref.actor.policy_loss.loss_mode={name} needs the behaviour log-probs of the rollout: "
                "set actor_rollout_ref.rollout.calculate_log_probs=true."]
    from hybrid_rl.trainer.config.schema import key_owner

    return [f"actor_rollout_ref.actor.policy_loss.loss_mode={name} needs {key} set (it is null); e.g. {key}=0.1."
            for key in loss_needs(cfg).requires if getattr(*key_owner(cfg, key)) is None]


def _check_dapo(cfg: PPOConfig) -> list[str]:
    """``algorithm.filter_groups`` (dynamic sampling) and ``reward_model.overlong_buffer``."""
    fg, buffer, errors = cfg.algorithm.filter_groups, cfg.reward_model.overlong_buffer, []
    if fg.enable:
        if not fg.metric:
            errors.append("algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric: acc, score, "
                          "seq_reward, seq_final_reward or a key the scorer returns.")
        if cfg.actor_rollout_ref.rollout.n < 2:
            errors.append(f"algorithm.filter_groups.enable=true drops groups whose responses agree, but "
                          f"actor_rollout_ref.rollout.n={cfg.actor_rollout_ref.rollout.n}; set rollout.n >= 2.")
        if cfg.async_training.enable:
            errors.append("algorithm.filter_groups.enable=true with async_training.enable=true: the decoupled mode's "
                          "producer does not refill dropped groups yet; run dynamic sampling in the synchronous mode.")
        if fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
            errors.append("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: the "
                          "in-reward KL is applied after the filter here; use seq_reward (or acc / score).")
    if buffer.enable and (buffer.len == 0 or buffer.len > cfg.data.max_response_length):  # < 0: its bound
        errors.append(f"reward_model.overlong_buffer.len={buffer.len} must lie in (0, data.max_response_length="
                      f"{cfg.data.max_response_length}]; e.g. {max(1, cfg.data.max_response_length // 4)}.")
    return errors


def _check_rollout_correction(cfg: PPOConfig) -> list[str]:
    """``algorithm.rollout_correction``: its values parse, the engine returns log-probs, the loss applies
    importance weights, bypass mode runs without a critic."""
    from hybrid_rl.algorithms.rollout_correction import (LOSS_TYPES, parse_is_threshold, parse_rejection_specs,
                                                         resolve_preset)

    key = "algorithm.rollout_correction"
    try:
        rc = resolve_preset(cfg.algorithm.rollout_correction)
        if rc.rollout_is not in (None, "token", "sequence"):
            raise ValueError(f"{key}.rollout_is={rc.rollout_is!r} must be token, sequence or null.")
        is_bounds = parse_is_threshold(rc.rollout_is_threshold)
        specs = parse_rejection_specs(rc.rollout_rs, rc.rollout_rs_threshold)
        for name, bounds, fix in (
                ("rollout_is_threshold", is_bounds, "2.0 or '0.5_2.0'"),
                ("rollout_rs_threshold", [b for s in specs for b in (s.lower, s.upper)],
                 "0.01 (k2/k3) or '0.999_1.001' (k1)")):
            if not all(math.isfinite(b) for b in bounds if b is not None):  # NaN passes the parsers' comparisons
                raise ValueError(f"{key}.{name}={getattr(rc, name)!r} is invalid: must be finite numbers. Fix: "
                                 f"use e.g. {fix}.")
        if rc.loss_type not in LOSS_TYPES:
            raise ValueError(f"{key}.loss_type={rc.loss_type!r} must be one of {LOSS_TYPES} (bypass mode's loss).")
    except ValueError as error:
        return [str(error)]
    if not rc.measured:
        return []
    what = ("bypass_mode=true" if rc.bypass_mode else f"rollout_is={rc.rollout_is}" if rc.rollout_is
            else f"rollout_rs={rc.rollout_rs}" if rc.rollout_rs else "preset=metrics")
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        return [f"{key}.{what} corrects against the rollout engine's log-probs, which it does not return: set "
                "actor_rollout_ref.rollout.calculate_log_probs=true."]
    loss = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if rc.rollout_is and not rc.bypass_mode and not loss_needs(cfg).applies_rollout_is_weights:
        from hybrid_rl.algorithms import describe_policy_losses

        takers = [n for n, i in describe_policy_losses().items() if i.applies_rollout_is_weights]
        return [f"{key}.rollout_is={rc.rollout_is} needs a policy loss that applies the weights, not "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}; use one of {takers} or drop rollout_is."]
    if rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is:
        return [f"{key}.rollout_is={rc.rollout_is} with bypass_mode=true and loss_type=ppo_clip: the clipped ratio "
                "against pi_rollout already corrects, the weights would count twice (veRL ignores them); use "
                "loss_type=reinforce (preset bypass_pg_is) or drop rollout_is."]
    if rc.bypass_mode and estimator_needs(cfg).needs_critic:
        return [f"{key}.bypass_mode=true with algorithm.adv_estimator={cfg.algorithm.adv_estimator} (a critic): bypass "
                "mode is built and tested for critic-free estimators (veRL's presets are); use rollout_is / rollout_rs "
                f"without bypass, or an estimator without a critic ({estimators_where(lambda i: not i.needs_critic)})."]
    return []


def _check_files(cfg: PPOConfig) -> list[str]:
    errors = check_data_files(cfg.data)
    model = cfg.actor_rollout_ref.model
    errors.extend(check_model_path("actor_rollout_ref.model.path", model.path, model.trust_remote_code))
    errors.extend(_tokenizer_problems(cfg))
    rollout = cfg.actor_rollout_ref.rollout
    files = [("custom_reward_function.path", cfg.custom_reward_function.path, "point it at a .py file or set it to null"),
             ("actor_rollout_ref.rollout.multi_turn.tool_config_path", rollout.multi_turn.tool_config_path,
              "point it at a YAML file (see docs/agents.md)"),
             ("actor_rollout_ref.rollout.multi_turn.interaction_config_path",
              rollout.multi_turn.interaction_config_path, "point it at a YAML file (see docs/agents.md)"),
             ("actor_rollout_ref.rollout.agent.agent_loop_config_path", rollout.agent.agent_loop_config_path,
              "point it at a YAML file (see docs/agents.md)")]
    errors.extend(problem for key, path, fix in files if path is not None
                  for problem in [file_problem(key, path, fix)] if problem)
    return errors


def _tokenizer_problems(cfg: PPOConfig) -> list[str]:
    """``data.tokenizer`` / ``actor_rollout_ref.model.tokenizer_path``, when set, name a folder (or the
    embedded model's id), as the tokenizer loader will need."""
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID

    key, path = (("data.tokenizer", cfg.data.tokenizer) if cfg.data.tokenizer
                 else ("actor_rollout_ref.model.tokenizer_path", cfg.actor_rollout_ref.model.tokenizer_path))
    local = os.path.expanduser(path or "")
    if not path or path == EMBEDDED_MODEL_ID or os.path.isdir(local):
        return []
    what = "is a file, not a folder" if os.path.exists(local) else "does not exist"
    return [f"{key}={path!r} {what}; point it at a local tokenizer folder or set it to null (the model's own)."]


def _check_reward(cfg: PPOConfig) -> list[str]:
    from hybrid_rl.trainer.config.reward_model import check_reward_model

    return check_reward_model(cfg)


def resume_point_problems(cfg: PPOConfig, point: Any) -> list[str]:
    """Why ``point`` (a :class:`~hybrid_rl.trainer.core.checkpoints.ResumePoint`) cannot be
    loaded by this run: a different worker count, or no critic for GAE. Empty if it fits."""
    errors = world_size_problems(cfg, point)
    if estimator_needs(cfg).needs_critic and not os.path.isdir(os.path.join(point.step_dir, "critic")):
        errors.append(
            f"cannot resume from {point.step_dir}: it has no critic/ folder but algorithm.adv_estimator="
            f"{cfg.algorithm.adv_estimator} needs "
            "one; resume a GAE run's checkpoint or set trainer.resume_mode=disable."
        )
    if point.state.get("async") and not cfg.async_training.enable:
        errors.append(
            f"cannot resume from {point.step_dir} in the synchronous mode: the decoupled mode wrote it, and its "
            "prompt position is the rollout's, ahead of training (the buffered batches would be skipped). Fix: "
            "resume with async_training.enable=true and the same async_training.buffer, or set "
            "trainer.resume_mode=disable."
        )
    return errors


def _check_async(cfg: PPOConfig) -> list[str]:
    """The decoupled mode's keys (docs/async.md)."""
    a, pool = cfg.async_training, cfg.rollout
    if not a.enable:
        return []
    errors = []
    eta, every = a.max_head_offpolicyness, a.trigger_parameter_sync_step
    if every > max(eta, 0) + 1:  # the lower bounds of both are declared on the fields
        errors.append(f"async_training.trigger_parameter_sync_step={every} must be between 1 and "
                      f"max_head_offpolicyness + 1 = {max(eta, 0) + 1}: with fewer weight pushes the rollout could "
                      "never produce samples fresh enough. Fix: lower it or raise max_head_offpolicyness.")
    if eta >= 1 and not _corrects_staleness(cfg):
        loss = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
        errors.append(f"async_training.max_head_offpolicyness={eta} trains rows sampled by weights up to {eta} "
                      f"version(s) old, but actor_rollout_ref.actor.policy_loss.loss_mode={loss} without a rollout "
                      "correction trains them as on-policy (no importance weight for the stale sampler). Fix: set "
                      "actor_rollout_ref.actor.policy_loss.loss_mode=decoupled (AReaL's loss), or a rollout correction "
                      "such as algorithm.rollout_correction.preset=token_tis, each with "
                      "actor_rollout_ref.rollout.calculate_log_probs=true; or async_training.max_head_offpolicyness=0.")
    t = cfg.trainer
    if t.nnodes == 1 and pool.nnodes == 1 and resolve_device(t.device) == "cpu":
        cores = cfg.ray_init.num_cpus or os.cpu_count() or 1
        if t.n_gpus_per_node + pool.n_gpus_per_node > cores:
            errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} training + rollout.n_gpus_per_node="
                          f"{pool.n_gpus_per_node} rollout CPU workers but only {cores} cores are available; lower "
                          "them so they sum to at most the core count (each process needs a core).")
    if a.partial_rollout and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        errors.append("async_training.partial_rollout=true samples one response with several policy versions, so "
                      "every token needs the behaviour log-prob of the weights that sampled it, but "
                      "actor_rollout_ref.rollout.calculate_log_probs=false. Fix: set "
                      "actor_rollout_ref.rollout.calculate_log_probs=true, or async_training.partial_rollout=false "
                      "(one prompt batch per engine call).")
    if estimator_needs(cfg).needs_greedy_baseline:
        errors.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a greedy baseline inside each "
                      "training step, which the decoupled mode does not run; use one that needs none with "
                      f"async_training.enable=true ({estimators_where(lambda i: not i.needs_greedy_baseline)}).")
    return errors


def _corrects_staleness(cfg: PPOConfig) -> bool:
    """The update weights stale rows by their sampler: a loss that reads the behaviour log-probs (the
    decoupled loss), or a rollout correction (importance weights, rejection or bypass mode)."""
    from hybrid_rl.algorithms.rollout_correction import resolve_preset

    if loss_needs(cfg).needs_rollout_log_probs:
        return True
    try:
        return resolve_preset(cfg.algorithm.rollout_correction).enabled
    except ValueError:
        return True  # an unknown preset is reported by _check_rollout_correction
