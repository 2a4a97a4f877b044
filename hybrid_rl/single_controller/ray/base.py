"""``RayWorkerGroup``: one Ray actor per bundle of a resource pool, driven as one object.

Every ``@register``-ed method of the worker class becomes a method of the group: ``wg.update_actor(batch)``
dispatches the arguments over the ranks, runs the method on them and collects the outputs (see
:mod:`hybrid_rl.single_controller.decorator`). Waiting is failure-aware
(:mod:`hybrid_rl.single_controller.future`): a dead worker raises ``WorkerGroupError`` naming it, and a
call longer than ``call_timeout_s`` raises ``WorkerGroupTimeoutError`` naming the silent ranks.

Rendezvous: before any actor starts, a zero-CPU task on rank 0's bundle picks ``MASTER_ADDR`` (that
node's IP) and a free ``MASTER_PORT``; every actor then starts with the full torch.distributed
environment, so worker constructors may call ``init_process_group`` right away.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybrid_rl.single_controller.decorator import RegisterSpec, collect_first, collect_list
from hybrid_rl.single_controller.errors import WorkerGroupError, WorkerInfo
from hybrid_rl.single_controller.future import WorkerGroupFuture, wait_for_results
from hybrid_rl.single_controller.group import WorkerGroup
from hybrid_rl.single_controller.ray.resource_pool import RayResourcePool
from hybrid_rl.single_controller.worker import Worker
from hybrid_rl.single_controller.worker_class import RayClassWithInitArgs
from hybrid_rl.utils.seeding import WORKER_SEED_ENV

__all__ = ["RayClassWithInitArgs", "RayWorkerGroup"]

logger = logging.getLogger(__name__)


def _rendezvous_task() -> Any:
    """A zero-CPU Ray task returning ``(node IP, free port)`` of the node it runs on.

    Built in a closure so that cloudpickle ships it by value: the task's process then needs neither
    torch nor hybrid_rl, which makes it start in well under a second even on a loaded machine.
    """

    def pick_master_addr_port() -> tuple[str, int]:
        import socket

        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), int(s.getsockname()[1])

    return ray.remote(num_cpus=0)(pick_master_addr_port)


class RayWorkerGroup(WorkerGroup):
    """One actor of ``ray_cls_with_init`` per bundle of ``resource_pool``, with the worker's registered
    methods bound onto this object.

    Args:
        resource_pool: where the actors go (one per bundle, ranks in bundle order).
        ray_cls_with_init: the worker class and its constructor arguments.
        name_prefix: prefix of the Ray actor names (random if None).
        call_timeout_s: deadline for every call (None = wait as long as the workers are alive).
        init_timeout_s: deadline for all actors to start and finish their constructors.
        seed: the run's seed: rank r seeds its Python/NumPy/torch generators with ``seed + r`` as it
            starts (None leaves them as Ray seeded them).
    """

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs,
                 name_prefix: str | None = None, call_timeout_s: float | None = None,
                 init_timeout_s: float = 600.0, seed: int | None = None):
        if call_timeout_s is not None and call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be > 0 or None, got {call_timeout_s}")
        self.resource_pool = resource_pool
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else secrets.token_hex(3)
        self.call_timeout_s = call_timeout_s
        self.seed = seed
        self.role = ray_cls_with_init.raw_cls.__name__
        self._workers: list[ray.actor.ActorHandle] = []
        self._infos: list[WorkerInfo] = []
        self._method_names: list[str] = []
        # Calls from several driver threads (the decoupled producer's generation and reward stages)
        # reach every rank in the same order, so collectives inside them pair up; views share it.
        self._submit_lock = threading.Lock()
        try:
            self._start_workers(init_timeout_s)
        except BaseException:
            self.shutdown()  # do not leave half a group running
            raise
        self._bind_methods(ray_cls_with_init.raw_cls, remote_prefix="")

    # ------------------------------------------------------------------ public surface
    @property
    def workers(self) -> list[ray.actor.ActorHandle]:
        """Actor handles, in rank order."""
        return list(self._workers)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerGroupFuture:
        """Call ``method_name`` with the same arguments on every rank; a future of the list of outputs."""
        refs = [getattr(w, method_name).remote(*args, **kwargs) for w in self._workers]
        return WorkerGroupFuture(refs, collect_list, f"{self.role}.{method_name}", self._infos,
                                 self.call_timeout_s, per_rank=True)

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method_name`` with the same arguments on every rank; list of outputs in rank order."""
        return self.execute_all_async(method_name, *args, **kwargs).get()

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerGroupFuture:
        """Call ``method_name`` on rank 0 only; a future of its output."""
        ref = getattr(self._workers[0], method_name).remote(*args, **kwargs)
        return WorkerGroupFuture([ref], collect_first, f"{self.role}.{method_name}", self._infos[:1],
                                 self.call_timeout_s)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method_name`` on rank 0 only and return its output (synchronous, unlike veRL's alias)."""
        return self.execute_rank_zero_async(method_name, *args, **kwargs).get()

    def shutdown(self) -> None:
        """Kill every actor of the group (and of its views); the resource pool stays reserved."""
        for worker in self._workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as e:  # noqa: BLE001 - already dead is fine
                logger.debug("ray.kill failed: %s", e)

    # ------------------------------------------------------------------ start-up
    def _start_workers(self, init_timeout_s: float) -> None:
        pool = self.resource_pool
        pgs = pool.get_placement_groups()
        slots = [(pg, b, n) for pg, n in zip(pgs, pool.process_on_nodes) for b in range(n)]
        world_size = len(slots)
        first = PlacementGroupSchedulingStrategy(pgs[0], placement_group_bundle_index=0)
        try:
            master_addr, master_port = ray.get(_rendezvous_task().options(scheduling_strategy=first).remote(),
                                               timeout=init_timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise WorkerGroupError(f"could not start a task on rank 0's bundle within {init_timeout_s} s "
                                   f"to pick MASTER_ADDR/PORT for {self.role}") from e
        for rank, (pg, bundle_index, local_world_size) in enumerate(slots):
            env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(bundle_index),
                   "LOCAL_WORLD_SIZE": str(local_world_size), "MASTER_ADDR": master_addr,
                   "MASTER_PORT": str(master_port), "WG_PREFIX": self.name_prefix}
            if self.seed is not None:  # each rank seeds its generators with seed + rank (utils/seeding.py)
                env[WORKER_SEED_ENV] = str(self.seed)
            name = f"{self.name_prefix}_{self.role}_{rank}"
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle_index)
            self._workers.append(self.ray_cls_with_init.create_actor(strategy, pool.actor_resources(), env, name))
            self._infos.append(WorkerInfo(self.role, rank, world_size, actor_name=name))
        refs = [w._hr_worker_info.remote() for w in self._workers]
        for info, reported in zip(self._infos, wait_for_results(refs, self._infos, "__init__", init_timeout_s)):
            info.pid, info.node_ip = reported["pid"], reported["node_ip"]
            info.actor_id, info.log_files = reported["actor_id"], reported["log_files"]
        logger.info("started %d workers of %s (master %s:%s)", world_size, self.role, master_addr, master_port)

    # ------------------------------------------------------------------ calls
    def _call(self, remote_name: str, display_name: str, spec: RegisterSpec, args: tuple, kwargs: dict) -> Any:
        plan = self._dispatch(spec, args, kwargs)
        with self._submit_lock:
            refs = [getattr(self._workers[r], remote_name).remote(*a, **k) for r, (a, k) in zip(plan.ranks, plan.arguments)]
        future = WorkerGroupFuture(refs, plan.collect_fn, display_name, [self._infos[r] for r in plan.ranks],
                                   self.call_timeout_s, per_rank=plan.per_rank)
        return future.get() if spec.blocking else future
