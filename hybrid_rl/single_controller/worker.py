"""``Worker``: base class of every process in a worker group (one per device).

The group starts each worker as a Ray actor with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment (the torch.distributed
``env://`` convention), so a subclass can call :meth:`Worker.init_process_group` in ``__init__`` or later.
Outside Ray (plain unit tests) the same class works as a single process of rank 0.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
from typing import Any

import torch

from hybrid_rl.utils.log_setup import configure_worker_logging
from hybrid_rl.utils.seeding import seed_worker

__all__ = ["Worker", "find_free_port"]

logger = logging.getLogger(__name__)


def find_free_port() -> int:
    """A TCP port that was free a moment ago on this host (for torch.distributed's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


class Worker:
    """Rank/world-size bookkeeping, CPU-thread configuration and process-group set-up for one worker."""

    def __init__(self) -> None:
        self._rank = _env_int("RANK", 0)
        self._world_size = _env_int("WORLD_SIZE", 1)
        self._local_rank = _env_int("LOCAL_RANK", 0)
        self._local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if not 0 <= self._rank < self._world_size:
            raise ValueError(f"RANK={self._rank} is outside [0, WORLD_SIZE={self._world_size})")
        if _in_ray_actor():
            configure_worker_logging(self._rank)  # before vLLM is imported: it reads the environment
        if _in_ray_actor():
            seed_worker(self._rank)  # Ray's workers start from clock-seeded generators (utils/seeding.py)
        if _in_ray_actor() and not torch.cuda.is_available():
            # Ray exports OMP_NUM_THREADS=1 for actors without an explicit CPU count; a CPU worker
            # must compute on every core the placement group gave it.
            self.configure_cpu_threads()

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        """Global rank of this worker in its group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return self._world_size

    @property
    def local_rank(self) -> int:
        """Rank among the group's workers on this node."""
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        """Number of the group's workers on this node."""
        return self._local_world_size

    @property
    def master_addr(self) -> str | None:
        """Rendezvous address of rank 0 (``MASTER_ADDR``), None outside a worker group."""
        return os.environ.get("MASTER_ADDR")

    @property
    def master_port(self) -> int | None:
        """Rendezvous port on rank 0's node (``MASTER_PORT``), None outside a worker group."""
        port = os.environ.get("MASTER_PORT")
        return int(port) if port else None

    @property
    def device(self) -> torch.device:
        """``cuda`` device of this worker if it has a GPU, else ``cpu``."""
        if torch.cuda.is_available():
            # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU; without Ray, use the local rank.
            index = 0 if torch.cuda.device_count() == 1 else self._local_rank
            return torch.device("cuda", index)
        return torch.device("cpu")

    # ------------------------------------------------------------------ set-up helpers
    def configure_cpu_threads(self) -> int:
        """Set torch's intra-op threads to the CPUs Ray assigned to this actor; return the count.

        Outside a Ray actor the current setting is kept.
        """
        if not _in_ray_actor():
            return torch.get_num_threads()
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        num_threads = max(1, int(cpus))
        torch.set_num_threads(num_threads)
        # Child processes (e.g. tokenizer or compile workers) read the variable, not torch's setting.
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
        return num_threads

    def init_process_group(self, backend: str | None = None, timeout_s: float = 600.0) -> str:
        """Join the group's ``torch.distributed`` process group (idempotent); return the backend.

        ``backend=None`` picks ``nccl`` on GPU and ``gloo`` on CPU. ``timeout_s`` bounds every
        collective, so a dead peer turns into an error instead of a hang.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.get_backend()
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if self.master_addr is None or self.master_port is None:
            if self._world_size > 1:
                raise RuntimeError(
                    f"MASTER_ADDR/MASTER_PORT are not set for rank {self._rank} of {self._world_size}: start "
                    "this worker through a RayWorkerGroup (it sets them), or export them yourself")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(find_free_port())
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        logger.info("rank %d/%d joined the %s process group at %s:%s", self._rank, self._world_size, backend,
                    self.master_addr, self.master_port)
        return backend

    def close(self) -> None:
        """Release what this worker holds outside Python's reach (an engine's threads or memory pools).

        Called by a group whose worker shares the driver's process
        (:class:`~hybrid_rl.single_controller.local.LocalWorkerGroup`) when it shuts down; a Ray
        actor's process simply ends. Subclasses holding such resources override it.
        """

    # ------------------------------------------------------------------ group internals
    def _hr_worker_info(self) -> dict[str, Any]:
        """Identity of this process for the group's error messages (called once after start)."""
        import ray

        return {
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "actor_id": ray.get_runtime_context().get_actor_id(),
            "log_files": tuple(_own_log_files()),
            "rank": self._rank,
        }


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")  # an actor's process has imported Ray; a one-process run may lack it
    if ray is None:
        return False
    try:
        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - no Ray runtime in this process
        return False


def _own_log_files() -> list[str]:
    """Where Ray redirected this process's stdout/stderr (``/proc/self/fd/{1,2}``; Linux only)."""
    paths = []
    for fd in (1, 2):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith("/") and os.path.isfile(path):
            paths.append(path)
    return paths
