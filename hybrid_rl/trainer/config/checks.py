"""One validation pass over the composed config, and the values derived from it.

:func:`validate_config` checks what no single group can check alone (batch sizes against the
number of workers, ``rollout.n`` against the estimator, a critic for GAE, files on disk, ...).
Every problem is one line naming the keys, their values and the fix; all problems are reported
together in one ``ValueError``. Derived values go into :class:`RunPlan`; the config is never
rewritten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from hybrid_rl.trainer.config.reward_model import is_remote
from hybrid_rl.trainer.config.schema import PPOConfig
from hybrid_rl.utils.cpu_env import CPU_ALLOCATORS
from hybrid_rl.utils.devices import DEVICES, resolve_device

if TYPE_CHECKING:
    from hybrid_rl.algorithms import AdvEstimatorInfo, PolicyLossInfo


@dataclass(frozen=True)
class RunPlan:
    """Values derived once from the config (never written back into it)."""

    device: str
    """Resolved device: cpu or cuda."""
    world_size: int
    """Data-parallel workers = nnodes * n_gpus_per_node."""
    use_critic: bool
    """A critic is trained (GAE)."""
    use_reference_policy: bool
    """The reference policy is needed (KL in reward or KL loss)."""
    threads_per_worker: int
    """CPU threads each worker process uses (cores split evenly among workers)."""
    rollout_world_size: int = 0
    """Decoupled mode: rollout workers in their own pool (rollout.nnodes * n_gpus_per_node); 0 = colocated."""
    use_reward_model: bool = False
    """A colocated reward-model worker scores responses (reward_model.enable with a local model)."""
    single_process: bool = False
    """The one worker lives in the driver's process (``trainer.single_process``), not in a Ray actor."""
    use_greedy_baseline: bool = False
    """Each step also generates and scores one greedy response per prompt (the estimator's
    ``needs_greedy_baseline``)."""


def as_file_list(files: Any) -> list[str]:
    """``data.train_files`` as a list: veRL accepts a single path or a list of paths."""
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    return [os.fspath(f) for f in files]


def run_dir(cfg: PPOConfig) -> str:
    """Absolute run folder (``trainer.default_local_dir``): checkpoints, metrics, plot, logs/."""
    return os.path.abspath(os.path.expanduser(cfg.trainer.default_local_dir))


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
    device = resolve_device(cfg.trainer.device)
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    actor = cfg.actor_rollout_ref.actor
    cores = cfg.ray_init.num_cpus or os.cpu_count() or 1
    decoupled = cfg.async_training.enable
    per_node = cfg.trainer.n_gpus_per_node + (cfg.rollout.n_gpus_per_node if decoupled else 0)
    needs = estimator_needs(cfg)
    return RunPlan(
        device=device,
        world_size=world,
        use_critic=needs.needs_critic,
        use_reference_policy=cfg.algorithm.use_kl_in_reward or actor.use_kl_loss,
        threads_per_worker=max(1, cores // per_node),
        rollout_world_size=cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if decoupled else 0,
        use_reward_model=cfg.reward_model.enable and not is_remote(cfg.reward_model.model.path),
        single_process=cfg.trainer.single_process is True,
        use_greedy_baseline=needs.needs_greedy_baseline,
    )


def validate_config(cfg: PPOConfig, *, training: bool = True) -> None:
    """Raise one ValueError listing every inconsistency of ``cfg`` (each line: keys, values, fix).

    ``training=False`` (``python -m hybrid_rl.eval`` / ``debug``: generate and score, no update) skips
    what only an update or a checkpoint uses: the mini/micro-batch sizes, token budgets and resume."""
    errors: list[str] = []
    checks = [_check_devices, _check_lengths, _check_algorithm, _check_files, _check_trainer, _check_reward,
              _check_async] + ([_check_batch_sizes, _check_resume] if training else [])
    for check in checks:
        errors.extend(check(cfg))
    if len(errors) == 1:
        raise ValueError(errors[0])
    if errors:
        raise ValueError(f"{len(errors)} config problems:\n" + "\n".join(f"- {e}" for e in errors))


def _check_devices(cfg: PPOConfig) -> list[str]:
    import torch

    t = cfg.trainer
    if t.device not in DEVICES:
        return [f"trainer.device={t.device!r} is not one of {DEVICES}; set trainer.device=auto."]
    errors = []
    if t.nnodes < 1 or t.n_gpus_per_node < 1:
        errors.append(
            f"trainer.nnodes={t.nnodes} and trainer.n_gpus_per_node={t.n_gpus_per_node} must both be >= 1."
        )
    device = resolve_device(t.device)
    if t.device == "cuda" and not torch.cuda.is_available():
        errors.append("trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu (or auto).")
    elif device == "cuda" and t.nnodes == 1 and t.n_gpus_per_node > torch.cuda.device_count():
        errors.append(
            f"trainer.n_gpus_per_node={t.n_gpus_per_node} but this machine has {torch.cuda.device_count()} GPUs; "
            "lower trainer.n_gpus_per_node."
        )
    elif device == "cpu" and t.nnodes == 1 and t.n_gpus_per_node > (cfg.ray_init.num_cpus or os.cpu_count() or 1):
        cores = cfg.ray_init.num_cpus or os.cpu_count()
        errors.append(
            f"trainer.n_gpus_per_node={t.n_gpus_per_node} CPU workers but only {cores} cores are available "
            "(ray_init.num_cpus / os.cpu_count()); lower trainer.n_gpus_per_node to at most the core count."
        )
    tp = getattr(cfg.actor_rollout_ref.rollout, "tensor_model_parallel_size", 1)
    if tp > 1 and t.n_gpus_per_node % tp != 0:
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
    if n < 1:
        return [f"actor_rollout_ref.rollout.n={n} must be >= 1 (responses per prompt)."]
    if data.train_batch_size < 1:
        return [f"data.train_batch_size={data.train_batch_size} must be >= 1."]
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
    errors = _check_estimator(cfg) + _check_policy_loss(cfg)
    if alg.kl_penalty not in KL_PENALTY_TYPES:
        errors.append(
            f"algorithm.kl_penalty={alg.kl_penalty!r} is not one of {list(KL_PENALTY_TYPES)}; set one of them "
            "(low_var_kl = k3 is the usual choice)."
        )
    if alg.kl_ctrl.type not in ("fixed", "adaptive"):
        errors.append(f"algorithm.kl_ctrl.type={alg.kl_ctrl.type!r} must be fixed or adaptive.")
    if not 0.0 <= alg.gamma <= 1.0 or not 0.0 <= alg.lam <= 1.0:
        errors.append(f"algorithm.gamma={alg.gamma} and algorithm.lam={alg.lam} must lie in [0, 1].")
    return errors


def _check_estimator(cfg: PPOConfig) -> list[str]:
    """``algorithm.adv_estimator`` is registered and the run gives it what its registry info says it needs."""
    from hybrid_rl.algorithms import registered_adv_estimators

    name, n, needs = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n, estimator_needs(cfg)
    if name not in registered_adv_estimators():
        return [f"algorithm.adv_estimator={name!r} is not registered; valid: {registered_adv_estimators()}."]
    errors = []
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
        errors.extend(_check_model_path("critic.model.path", cfg.critic.model.path))
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
    return []


def _check_model_path(key: str, path: str, trust_remote_code: Optional[bool] = None) -> list[str]:
    """A local HF folder or the embedded model id; with ``trust_remote_code`` given, also a causal LM."""
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, causal_lm_problem

    if not path:
        return [f"{key} is empty; set it to a local HF model folder or {EMBEDDED_MODEL_ID!r} (a critic usually "
                "starts from the actor's model path)."]
    if path == EMBEDDED_MODEL_ID:
        return []
    local = os.path.expanduser(path)
    if not os.path.isfile(os.path.join(local, "config.json")):
        return [f"{key}={path!r} is not a local HF model folder (no config.json) nor {EMBEDDED_MODEL_ID!r}; fix the path."]
    problem = None if trust_remote_code is None else causal_lm_problem(local, key, trust_remote_code)
    return [problem] if problem else []


def _check_files(cfg: PPOConfig) -> list[str]:
    errors = []
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for path in as_file_list(files):
            if not os.path.isfile(os.path.expanduser(path)):
                errors.append(f"{key}: file {path!r} does not exist; fix the path or leave {key} unset.")
    if cfg.data.train_files is None and cfg.data.val_files is not None:
        errors.append(
            "data.val_files is set but data.train_files is not (the built-in arithmetic task is used); "
            "set both, or neither."
        )
    model = cfg.actor_rollout_ref.model
    errors.extend(_check_model_path("actor_rollout_ref.model.path", model.path, model.trust_remote_code))
    path = cfg.custom_reward_function.path
    if path is not None and not os.path.isfile(os.path.expanduser(path)):
        errors.append(f"custom_reward_function.path={path!r} does not exist; point it at a .py file or set it to null.")
    return errors


def _check_trainer(cfg: PPOConfig) -> list[str]:
    from hybrid_rl.trainer.core.checkpoints import RESUME_MODES
    from hybrid_rl.trainer.core.tracking import as_backend_list, check_backends
    from hybrid_rl.utils.log_setup import LOG_LEVELS

    t = cfg.trainer
    if not isinstance(t.logger, str) and not all(isinstance(b, str) for b in t.logger or []):
        return [f"trainer.logger={t.logger!r} must be a tracker name or a list of them, e.g. "
                "trainer.logger=console or trainer.logger=[console,jsonl]."]
    errors = check_backends(as_backend_list(t.logger))
    if t.use_legacy_worker_impl not in ("auto", "enable"):
        errors.append(f"trainer.use_legacy_worker_impl={t.use_legacy_worker_impl!r} asks for veRL's new engine "
                      "workers, which hybrid_rl does not have; set it to auto (or enable).")
    if t.cpu_allocator not in CPU_ALLOCATORS:
        errors.append(f"trainer.cpu_allocator={t.cpu_allocator!r} must be one of {CPU_ALLOCATORS}; use auto "
                      "(jemalloc where Ray ships it), glibc or jemalloc.")
    if t.single_process not in (None, True, False):
        errors.append(f"trainer.single_process={t.single_process!r} must be true, false or null (auto).")
    elif t.single_process:
        from hybrid_rl.trainer.core.single_process import single_process_blockers

        blockers = single_process_blockers(cfg, resolve_device(t.device) if t.device in DEVICES else None)
        if blockers:
            errors.append(f"trainer.single_process=true cannot host {'; '.join(blockers)}: these need the workers "
                          "in Ray processes. Set trainer.single_process=false (or null to choose automatically).")
    if t.log_level.lower() not in LOG_LEVELS:
        errors.append(f"trainer.log_level={t.log_level!r} must be one of {LOG_LEVELS}; use info (quiet console) "
                      "or debug (everything).")
    if t.total_training_steps is not None and t.total_training_steps < 1:
        errors.append(f"trainer.total_training_steps={t.total_training_steps} must be >= 1 or null.")
    if t.total_epochs < 1:
        errors.append(f"trainer.total_epochs={t.total_epochs} must be >= 1.")
    for key in ("save_freq", "test_freq"):
        value = getattr(t, key)
        if value == 0 or value < -1:
            errors.append(f"trainer.{key}={value} must be a positive number of steps or -1 (never).")
    if t.worker_call_timeout_s is not None and t.worker_call_timeout_s <= 0:
        errors.append(f"trainer.worker_call_timeout_s={t.worker_call_timeout_s} must be > 0 seconds or null.")
    if t.resume_mode not in RESUME_MODES:
        errors.append(f"trainer.resume_mode={t.resume_mode!r} must be one of {RESUME_MODES}.")
    elif t.resume_mode == "resume_path" and not t.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>.")
    if t.max_actor_ckpt_to_keep is not None and t.max_actor_ckpt_to_keep < 1:
        errors.append(f"trainer.max_actor_ckpt_to_keep={t.max_actor_ckpt_to_keep} must be >= 1 or null (keep all).")
    if t.max_critic_ckpt_to_keep not in (None, t.max_actor_ckpt_to_keep):
        errors.append(
            f"trainer.max_critic_ckpt_to_keep={t.max_critic_ckpt_to_keep} differs from trainer.max_actor_ckpt_to_keep="
            f"{t.max_actor_ckpt_to_keep}: actor and critic share one step folder; set it to null."
        )
    return errors


def _check_reward(cfg: PPOConfig) -> list[str]:
    from hybrid_rl.trainer.config.reward_model import check_reward_model

    errors = check_reward_model(cfg)
    if cfg.reward_model.enable and cfg.async_training.enable:
        errors.append("reward_model.enable=true with async_training.enable=true: the decoupled mode scores with rules "
                      "and functions only so far. Fix: run the learned reward model in the synchronous mode.")
    if cfg.reward_model.timeout <= 0:
        errors.append(f"reward_model.timeout={cfg.reward_model.timeout} must be > 0 seconds.")
    return errors


def _check_resume(cfg: PPOConfig) -> list[str]:
    """The checkpoint a resume would load exists, is complete and fits this run (checked before Ray starts)."""
    from hybrid_rl.trainer.core.checkpoints import RESUME_MODES, CheckpointManager

    t = cfg.trainer
    if t.resume_mode not in RESUME_MODES or (t.resume_mode == "resume_path" and not t.resume_from_path):
        return []  # reported by _check_trainer
    try:
        point = CheckpointManager(t.default_local_dir).resolve_resume(t.resume_mode, t.resume_from_path)
    except (ValueError, OSError) as error:
        return [f"{error} (trainer.resume_mode={t.resume_mode})"]
    return [] if point is None else resume_point_problems(cfg, point)


def resume_point_problems(cfg: PPOConfig, point: Any) -> list[str]:
    """Why ``point`` (a :class:`~hybrid_rl.trainer.core.checkpoints.ResumePoint`) cannot be
    loaded by this run: a different worker count, or no critic for GAE. Empty if it fits."""
    t = cfg.trainer
    errors = []
    saved, world = point.state.get("world_size"), t.nnodes * t.n_gpus_per_node
    if saved is not None and saved != world:
        errors.append(
            f"cannot resume from {point.step_dir}: it was saved by {saved} workers but this run has {world} "
            f"(trainer.nnodes={t.nnodes} * trainer.n_gpus_per_node={t.n_gpus_per_node}). Each worker saved its own "
            f"shard of the weights and optimizer state and its own RNG stream, so they only reload on {saved} "
            f"workers: set trainer.n_gpus_per_node so that nnodes * n_gpus_per_node = {saved}, or start fresh "
            "with trainer.resume_mode=disable (or another trainer.default_local_dir)."
        )
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
    if eta < 0:
        errors.append(f"async_training.max_head_offpolicyness={eta} must be >= 0 (0 = synchronous order, 1-2 typical).")
    if every < 1 or every > max(eta, 0) + 1:
        errors.append(f"async_training.trigger_parameter_sync_step={every} must be between 1 and "
                      f"max_head_offpolicyness + 1 = {max(eta, 0) + 1}: with fewer weight pushes the rollout could "
                      "never produce samples fresh enough. Fix: lower it or raise max_head_offpolicyness.")
    if pool.nnodes < 1 or pool.n_gpus_per_node < 1:
        errors.append(f"rollout.nnodes={pool.nnodes} and rollout.n_gpus_per_node={pool.n_gpus_per_node} (the "
                      "decoupled mode's rollout pool) must both be >= 1.")
    t = cfg.trainer
    if t.nnodes == 1 and pool.nnodes == 1 and resolve_device(t.device) == "cpu":
        cores = cfg.ray_init.num_cpus or os.cpu_count() or 1
        if t.n_gpus_per_node + pool.n_gpus_per_node > cores:
            errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} training + rollout.n_gpus_per_node="
                          f"{pool.n_gpus_per_node} rollout CPU workers but only {cores} cores are available; lower "
                          "them so they sum to at most the core count (each process needs a core).")
    if estimator_needs(cfg).needs_greedy_baseline:
        errors.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a greedy baseline inside each "
                      "training step, which the decoupled mode does not run; use one that needs none with "
                      f"async_training.enable=true ({estimators_where(lambda i: not i.needs_greedy_baseline)}).")
    return errors
