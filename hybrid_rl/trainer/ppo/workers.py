"""The worker groups of a PPO-family run, built from its :class:`PPOConfig`: the colocated actor /
rollout (+ ref) (+ critic) (+ reward model) group, the decoupled mode's rollout pool, the
distillation teachers' own pool and evaluation's rollout-only group. Ray start-up, the colocated
group and the role map are the core's (:mod:`hybrid_rl.trainer.core.worker_groups`)."""

from __future__ import annotations

import os
from typing import Any, Optional

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core import worker_groups as core_groups
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.utils.log_setup import LOG_DIR_ENV
from hybrid_rl.workers.config import CriticConfig


def build_worker_groups(cfg: PPOConfig, plan: RunPlan, total_training_steps: int, actor_cls: Optional[type] = None,
                        critic_cls: Optional[type] = None, call_timeout_s: Optional[float] = None,
                        log_dir: Optional[str] = None, rollout_rows_per_call: Optional[int] = None) -> WorkerGroups:
    """PPO's roles on :func:`~hybrid_rl.trainer.core.worker_groups.build_worker_groups`: the actor
    (with the distillation teachers when enabled), the critic (GAE), the colocated reward model, then
    the decoupled mode's rollout pool and the teachers' own pool."""
    from hybrid_rl.single_controller import RayClassWithInitArgs
    from hybrid_rl.workers import CriticWorker

    extra: dict[str, Any] = {}
    if plan.use_critic:
        extra["critic"] = RayClassWithInitArgs(critic_cls or CriticWorker, config=cfg.critic,
                                               total_training_steps=total_training_steps)
    if plan.use_reward_model and not plan.rollout_world_size:  # decoupled: in the rollout processes
        extra["rm"] = _reward_model_worker(cfg, plan.world_size)
    groups = core_groups.build_worker_groups(
        cfg, plan, total_training_steps, cfg.actor_rollout_ref, actor_cls=actor_cls, extra_classes=extra,
        actor_kwargs=_distillation(cfg.distillation), call_timeout_s=call_timeout_s, log_dir=log_dir,
        rollout_rows_per_call=rollout_rows_per_call)
    try:
        _add_own_pools(groups, cfg, plan, actor_cls, call_timeout_s, log_dir, rollout_rows_per_call,
                       total_training_steps)
    except BaseException:
        groups.shutdown()  # the trainer never got the groups: release what was started
        raise
    return groups


def memory_hint(cfg: PPOConfig) -> str:
    """What to lower when a worker died without a traceback, as the kernel's OOM killer leaves it."""
    a = cfg.actor_rollout_ref
    allocator = ("" if cfg.trainer.cpu_allocator != "glibc"
                 else "set trainer.cpu_allocator=auto (jemalloc; now glibc), ")
    return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower "
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu (now {a.actor.ppo_max_token_len_per_gpu}) or "
            f"the batch, {allocator}set "
            f"actor_rollout_ref.model.enable_gradient_checkpointing=true, or train LoRA "
            f"adapters (actor_rollout_ref.model.lora_rank=32); each run logs perf/peak_rss_gib/<step>.")


def _distillation(distillation: Any) -> dict[str, Any]:
    """The training worker's ``distillation`` argument: only when enabled."""
    return {"distillation": distillation} if distillation.enabled else {}


def _add_own_pools(groups: WorkerGroups, cfg: PPOConfig, plan: RunPlan, actor_cls: Optional[type],
                   call_timeout_s: Optional[float], log_dir: Optional[str], rollout_rows_per_call: Optional[int],
                   total_training_steps: int) -> None:
    """The decoupled mode's rollout pool (with the reward model, when local) and the teachers' pool."""
    if plan.rollout_world_size:
        rollout, pool, rm_view = _rollout_group(
            cfg, plan, [cfg.rollout.n_gpus_per_node] * cfg.rollout.nnodes, worker_cls=actor_cls,
            rows_per_call=rollout_rows_per_call, call_timeout_s=call_timeout_s, log_dir=log_dir,
            total_training_steps=total_training_steps, with_reward_model=plan.use_reward_model)
        groups.add({"rollout": rollout, "reward_model": None if groups.reward_model else rm_view}, pool)
    if plan.teacher_world_size:
        teacher, pool = build_teacher_group(cfg, plan, worker_cls=actor_cls, call_timeout_s=call_timeout_s,
                                            log_dir=log_dir)
        groups.add({"teacher": teacher}, pool)


def build_rollout_group(cfg: PPOConfig, plan: RunPlan, process_on_nodes: list[int], *,
                        worker_cls: Optional[type] = None, rows_per_call: Optional[int] = None,
                        call_timeout_s: Optional[float] = None, log_dir: Optional[str] = None,
                        total_training_steps: Optional[int] = None) -> tuple[Any, Any]:
    """``(group, pool)``: rollout-only workers (role ``rollout``, no actor or optimizer) in their own
    pool, for the decoupled mode and for evaluation. Logs go to ``log_dir/rollout/``.
    ``total_training_steps`` (training only) lets a CPU engine decide whether compiling pays off."""
    group, pool, _ = _rollout_group(cfg, plan, process_on_nodes, worker_cls=worker_cls, rows_per_call=rows_per_call,
                                    call_timeout_s=call_timeout_s, log_dir=log_dir,
                                    total_training_steps=total_training_steps)
    return group, pool


def _rollout_group(cfg: PPOConfig, plan: RunPlan, process_on_nodes: list[int], *, worker_cls: Optional[type],
                   rows_per_call: Optional[int], call_timeout_s: Optional[float], log_dir: Optional[str],
                   total_training_steps: Optional[int], with_reward_model: bool = False) -> tuple[Any, Any, Any]:
    """``(rollout group, pool, reward-model view or None)``. ``with_reward_model`` (the decoupled mode
    with a local reward model) hosts a reward-model worker in each rollout process: the producer's
    scoring then queues behind generation on the rollout devices, never behind the trainer's update."""
    from hybrid_rl.single_controller import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_cls
    from hybrid_rl.workers import ActorRolloutRefWorker

    core_groups.start_ray(cfg, plan, log_dir)
    pool = RayResourcePool(process_on_nodes, use_gpu=plan.device == "cuda", name_prefix="rollout_",
                           num_cpus_per_process=None if plan.device == "cuda" else plan.threads_per_worker)
    worker = RayClassWithInitArgs(worker_cls or ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="rollout",
                                  rollout_rows_per_call=rows_per_call, total_training_steps=total_training_steps,
                                  **core_groups.agent_plugins(cfg.actor_rollout_ref))
    if with_reward_model:  # the reward model first: the engine sizes its cache from what memory is left
        worker = create_colocated_worker_cls({"rm": _reward_model_worker(cfg, sum(process_on_nodes)),
                                              "rollout": worker})
    if log_dir:  # apart from the training ranks' worker_<rank>.log files
        worker.update_options({"runtime_env": {"env_vars": {LOG_DIR_ENV: os.path.join(log_dir, "rollout")}}})
    if not with_reward_model:
        return core_groups.init_group(pool, worker, call_timeout_s, cfg.trainer.seed), pool, None
    from hybrid_rl.single_controller import RayWorkerGroup

    try:
        group = RayWorkerGroup(pool, worker, call_timeout_s=call_timeout_s, seed=cfg.trainer.seed)
        views = group.spawn(["rm", "rollout"])
        views["rm"].init_model()
        views["rollout"].init_model()
    except BaseException:
        pool.remove()
        raise
    return views["rollout"], pool, views["rm"]


def build_teacher_group(cfg: PPOConfig, plan: RunPlan, *, worker_cls: Optional[type] = None,
                        call_timeout_s: Optional[float] = None, log_dir: Optional[str] = None) -> tuple[Any, Any]:
    """``(group, pool)``: the distillation teachers in their own pool (role ``teacher``: no actor,
    rollout or reference), ``distillation.nnodes x n_gpus_per_node`` workers, each hosting every
    teacher and scoring its share of the rows. Logs go to ``log_dir/teacher/``."""
    from hybrid_rl.single_controller import RayClassWithInitArgs, RayResourcePool
    from hybrid_rl.workers import ActorRolloutRefWorker

    d = cfg.distillation
    pool = RayResourcePool([d.n_gpus_per_node] * d.nnodes, use_gpu=plan.device == "cuda", name_prefix="teacher_",
                           num_cpus_per_process=None if plan.device == "cuda" else plan.threads_per_worker)
    worker = RayClassWithInitArgs(worker_cls or ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="teacher",
                                  distillation=d)
    if log_dir:
        worker.update_options({"runtime_env": {"env_vars": {LOG_DIR_ENV: os.path.join(log_dir, "teacher")}}})
    return core_groups.init_group(pool, worker, call_timeout_s, cfg.trainer.seed), pool


def _reward_model_worker(cfg: PPOConfig, world_size: int):
    """The colocated reward-model worker of RL (role ``rm``) in a group of ``world_size`` processes:
    scoring only, responses decoded with the policy's tokenizer (``reward_model.model.input_tokenizer``,
    default the actor's)."""
    from hybrid_rl.single_controller import RayClassWithInitArgs
    from hybrid_rl.workers.model_loader import resolve_tokenizer_path
    from hybrid_rl.workers.rm_worker import RewardModelWorker

    model = cfg.actor_rollout_ref.model
    policy_tokenizer = cfg.reward_model.model.input_tokenizer or cfg.data.tokenizer or model.tokenizer_path or model.path
    return RayClassWithInitArgs(RewardModelWorker, config=rm_worker_config(cfg, world_size),
                                input_tokenizer=resolve_tokenizer_path(policy_tokenizer, key="reward_model.model.input_tokenizer"),
                                max_length=cfg.reward_model.max_length, normalize=cfg.reward_model.normalize)


def rm_worker_config(cfg: PPOConfig, world_size: int) -> CriticConfig:
    """The value-model config a :class:`~hybrid_rl.workers.rm_worker.RewardModelWorker` is built from
    (scoring only: its optimizer never steps, so it holds no state)."""
    rm = cfg.reward_model
    return CriticConfig(model=rm.model.as_critic_model(), rollout_n=1, ppo_mini_batch_size=world_size,
                        use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=rm.micro_batch_size_per_gpu)
