"""The worker groups a run drives, built from its config: Ray start-up, the colocated actor/rollout/ref
group (+ the mode's other colocated workers) or the one worker in the driver's process, the
reward-model group, and how many rows the rollout engine holds at once.

The builders read the sections every mode has (``trainer``, ``ray_init``, ``data``:
:class:`RunConfig`); what a worker is built from is its typed config, which the mode passes in
(PPO's roles: :mod:`hybrid_rl.trainer.ppo.workers`)."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core.run_config import RunConfig
from hybrid_rl.utils.cpu_env import cpu_worker_env
from hybrid_rl.utils.log_setup import LOG_DIR_ENV, effective_level, library_env, quiet_in_process_workers
from hybrid_rl.utils.precision import profile_env
from hybrid_rl.workers.config import ActorRolloutRefConfig, CriticConfig
from hybrid_rl.workers.rollout.config import RolloutConfig

logger = logging.getLogger(__name__)


class WorkerGroups:
    """The worker groups a run drives, by role (``workers.groups["actor_rollout"]``), and their devices.

    Roles: ``actor_rollout`` (actor / rollout / reference methods; None in reward-model training),
    ``critic``, ``reward_model`` (reward-model training's group, or RL's reward model in the training
    or, decoupled, the rollout processes), ``rollout`` (the decoupled mode's rollout group),
    ``teacher`` (distillation teachers in their own pool); a mode may add its own. Views that share
    processes form one unit with the pool it reserved (None for a worker in the driver's process):
    :meth:`shutdown` stops each unit once and releases its pool. ``workers.critic`` reads a role
    too, None when the run has none."""

    def __init__(self, actor_rollout: Optional[Any] = None, critic: Optional[Any] = None,
                 resource_pool: Optional[Any] = None, **roles: Any):
        """The colocated unit: ``actor_rollout``, ``critic`` and any other ``roles`` (views of one
        group) on ``resource_pool``."""
        self.groups: dict[str, Any] = {}
        """Every role's group (a view of its unit's group)."""
        self._units: list[tuple[tuple[str, ...], Any]] = []
        self.add({"actor_rollout": actor_rollout, "critic": critic, **roles}, resource_pool)

    def add(self, views: dict[str, Any], pool: Optional[Any]) -> None:
        """A unit: ``views`` (role -> view; None = no such role) of one group, on ``pool``."""
        views = {role: view for role, view in views.items() if view is not None}
        taken = sorted(set(views) & set(self.groups))
        if taken:
            raise ValueError(f"worker roles {taken} have a group already; give each role one group.")
        self.groups.update(views)
        self._units.append((tuple(views), pool))

    def __getattr__(self, role: str) -> Optional[Any]:
        if role.startswith("_") or role == "groups":  # not set yet (copying, unpickling)
            raise AttributeError(role)
        return self.groups.get(role)

    def pool_of(self, role: str) -> Optional[Any]:
        """The devices of ``role``'s unit (None: no such role, or a worker in the driver's process)."""
        return next((pool for roles, pool in self._units if role in roles), None)

    @property
    def resource_pool(self) -> Optional[Any]:
        """The colocated group's devices."""
        return self._units[0][1]

    @property
    def rollout_pool(self) -> Optional[Any]:
        """Decoupled mode: the rollout group's devices."""
        return self.pool_of("rollout")

    @property
    def teacher_pool(self) -> Optional[Any]:
        """The distillation teachers' devices (``distillation.nnodes`` > 0)."""
        return self.pool_of("teacher")

    def shutdown(self) -> None:
        """Stop each unit's processes (through one of its views) and release its devices."""
        for roles, pool in self._units:
            if roles:
                self.groups[roles[0]].shutdown()  # the views share the group's processes
            if pool is not None:  # None when the worker lives in the driver's process
                pool.remove()


VAL_ROWS_IN_FLIGHT = 64
"""Validation rows the engine's KV cache is sized to hold at once (per val_kwargs.n sample): on 2
CPU cores greedy validation of 200 rows took as long with 64 in flight (7.4-7.6 s) as with all 200
(7.4-7.9 s), and the cache for 200 rows held 0.8 GiB (docs/memory.md)."""


def rollout_rows_per_call(cfg: RunConfig, plan: RunPlan, val_dataset: Any, rollout: RolloutConfig) -> int:
    """Rows the rollout engine configured by ``rollout`` should hold at once per worker (it sizes vLLM-CPU's KV cache): a training batch (x n), or a validation batch
    (x val_kwargs.n) up to VAL_ROWS_IN_FLIGHT; larger validation batches queue in the engine. Split
    over the workers."""
    rows = cfg.data.train_batch_size * rollout.n
    t = cfg.trainer
    if val_dataset is not None and (t.test_freq > 0 or t.val_before_train or t.val_at_end):
        val_batch = cfg.data.val_batch_size or len(val_dataset)
        rows = max(rows, min(val_batch, len(val_dataset), VAL_ROWS_IN_FLIGHT) * rollout.val_kwargs.n)
    return -(-rows // (plan.rollout_world_size or plan.world_size))


def start_ray(cfg: RunConfig, plan: RunPlan, log_dir: Optional[str]) -> None:
    """Join or start Ray with the workers' environment (CPU threads, allocator, log folder)."""
    from hybrid_rl.single_controller import init_ray

    # CPU workers get the driver's probe result, so every rank resolves dtype auto the same way.
    env_vars = ({**cpu_worker_env(os.environ, cfg.trainer.cpu_allocator), **profile_env()}
                if plan.device == "cpu" else {})
    env_vars.update(library_env(cfg.trainer.log_level), **({LOG_DIR_ENV: log_dir} if log_dir else {}))
    init_ray(address=cfg.ray_init.address, num_cpus=cfg.ray_init.num_cpus, runtime_env={"env_vars": env_vars},
             quiet=effective_level(cfg.trainer.log_level) != "debug")


def agent_plugins(actor_rollout_ref: ActorRolloutRefConfig) -> dict[str, Any]:
    """Tools and interactions registered in the driver (a notebook), for the rollout workers."""
    from hybrid_rl.agents.config import agent_rollout_enabled

    if not agent_rollout_enabled(actor_rollout_ref.rollout):
        return {}
    from hybrid_rl.agents.plugins import plugin_snapshot

    return {"agent_plugins": plugin_snapshot()}


def init_group(pool: Any, worker: Any, call_timeout_s: Optional[float], seed: int) -> Any:
    """A ``RayWorkerGroup`` of ``worker`` on ``pool`` with its models built; the pool is released
    when that fails."""
    from hybrid_rl.single_controller import RayWorkerGroup

    try:
        group = RayWorkerGroup(pool, worker, call_timeout_s=call_timeout_s, seed=seed)
        group.init_model()
    except BaseException:
        pool.remove()
        raise
    return group


def build_worker_groups(cfg: RunConfig, plan: RunPlan, total_training_steps: int,
                        actor_config: ActorRolloutRefConfig, *, actor_cls: Optional[type] = None,
                        extra_classes: Optional[dict[str, Any]] = None, actor_kwargs: Optional[dict[str, Any]] = None,
                        call_timeout_s: Optional[float] = None, log_dir: Optional[str] = None,
                        rollout_rows_per_call: Optional[int] = None) -> WorkerGroups:
    """Start ``world_size`` colocated processes, each hosting actor + rollout (+ ref) built from
    ``actor_config`` and the mode's ``extra_classes`` (role -> ``RayClassWithInitArgs``: ``critic``,
    ``rm`` = role ``reward_model``, ...); in the decoupled mode (``plan.rollout_world_size > 0``) the
    actor worker hosts no rollout (the mode adds its rollout pool).

    ``total_training_steps`` sizes the LR schedules and ``rollout_rows_per_call`` (the most rows one
    generate call brings a rollout worker) the CPU engine's KV cache; both are passed to the workers,
    never written into their configs; ``actor_kwargs`` are the actor worker's further arguments. Each
    worker writes its full log to ``log_dir/worker_<rank>.log``.
    """
    from hybrid_rl.single_controller import RayClassWithInitArgs, create_colocated_worker_cls
    from hybrid_rl.workers import ActorRolloutRefWorker

    role = "actor_rollout_ref" if plan.use_reference_policy else "actor_rollout"
    if plan.rollout_world_size:
        role = role.replace("_rollout", "")
    classes = {"actor_rollout": RayClassWithInitArgs(
        actor_cls or ActorRolloutRefWorker, config=actor_config, role=role, total_training_steps=total_training_steps,
        rollout_rows_per_call=rollout_rows_per_call, **agent_plugins(actor_config), **(actor_kwargs or {})),
        **(extra_classes or {})}
    group, pool = _colocated_group(cfg, plan, create_colocated_worker_cls(classes), call_timeout_s, log_dir)
    views = group.spawn(list(classes))
    try:
        # The others first (critic, reward model): the rollout engine sizes its cache from what memory is left.
        for name in classes:
            if name != "actor_rollout":
                views[name].init_model()
        views["actor_rollout"].init_model()
    except BaseException:
        group.shutdown()  # the trainer never got the group: its shutdown cannot stop it
        if pool is not None:
            pool.remove()
        raise
    roles = {_ROLE_OF.get(name, name): view for name, view in views.items() if name != "actor_rollout"}
    return WorkerGroups(actor_rollout=views["actor_rollout"], resource_pool=pool, **roles)


_ROLE_OF = {"rm": "reward_model"}
"""Colocated class names whose :class:`WorkerGroups` role is named otherwise."""


def _colocated_group(cfg: RunConfig, plan: RunPlan, worker: Any, call_timeout_s: Optional[float],
                     log_dir: Optional[str]) -> tuple[Any, Any]:
    """``(group, pool)`` of the colocated worker: in the driver's process when ``plan.single_process``
    (no pool), else one Ray actor per device."""
    if plan.single_process:
        from hybrid_rl.single_controller.local import LocalWorkerGroup
        from hybrid_rl.trainer.core.single_process import apply_process_env

        apply_process_env(cfg)
        quiet_in_process_workers()
        return LocalWorkerGroup(worker, num_threads=plan.threads_per_worker), None
    from hybrid_rl.single_controller import RayResourcePool, RayWorkerGroup

    start_ray(cfg, plan, log_dir)
    pool = RayResourcePool(
        [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes,
        use_gpu=plan.device == "cuda",
        num_cpus_per_process=None if plan.device == "cuda" else plan.threads_per_worker,
    )
    try:
        return RayWorkerGroup(pool, worker, call_timeout_s=call_timeout_s, seed=cfg.trainer.seed), pool
    except BaseException:  # an actor that failed to start: the reserved devices go back too
        pool.remove()
        raise


def build_reward_model_group(cfg: RunConfig, plan: RunPlan, total_training_steps: int, worker_config: CriticConfig, *,
                             worker_cls: Optional[type] = None, call_timeout_s: Optional[float] = None,
                             log_dir: Optional[str] = None) -> WorkerGroups:
    """Reward-model training (``main_rm``): ``world_size`` processes hosting only a
    :class:`~hybrid_rl.workers.rm_worker.RewardModelWorker` built from ``worker_config`` (in the
    driver's process when ``plan.single_process``)."""
    from hybrid_rl.single_controller import RayClassWithInitArgs
    from hybrid_rl.workers.rm_worker import RewardModelWorker

    worker = RayClassWithInitArgs(worker_cls or RewardModelWorker, config=worker_config,
                                  total_training_steps=total_training_steps)
    group, pool = _colocated_group(cfg, plan, worker, call_timeout_s, log_dir)
    try:
        group.init_model()
    except BaseException:
        group.shutdown()
        if pool is not None:
            pool.remove()
        raise
    return WorkerGroups(actor_rollout=None, critic=None, resource_pool=pool, reward_model=group)
