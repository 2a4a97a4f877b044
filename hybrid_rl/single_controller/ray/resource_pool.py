"""``RayResourcePool``: the devices (GPUs, or CPU slices) a worker group runs on, as Ray placement groups.

One placement group per node entry, one bundle per process; bundles are reserved up front
(``STRICT_PACK`` within a node entry) so a group either gets all its devices or fails with a clear
message instead of waiting forever for resources that will never come.
"""

from __future__ import annotations

import logging
import secrets

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

__all__ = ["RayResourcePool"]

logger = logging.getLogger(__name__)


class RayResourcePool:
    """Processes per node, GPU or CPU bundles, and how many worker groups may share a bundle.

    Args:
        process_on_nodes: number of processes (devices) on each node, e.g. ``[2]`` or ``[8, 8]``.
        use_gpu: one GPU per bundle if True; CPU-only bundles otherwise.
        max_colocate_count: how many separate worker groups may place one actor in each bundle (each
            gets ``1/max_colocate_count`` of it). Roles fused with ``create_colocated_worker_cls`` share
            one actor and need 1.
        name_prefix: prefix of the placement-group names.
        num_cpus_per_process: CPUs per bundle. Default: on CPU, the cluster's available CPUs divided
            evenly over the processes (so CPU workers use the whole machine); on GPU,
            ``max_colocate_count``.
        pg_timeout_s: how long to wait for the cluster to grant the bundles before raising.
    """

    def __init__(self, process_on_nodes: list[int], use_gpu: bool, max_colocate_count: int = 1,
                 name_prefix: str = "", num_cpus_per_process: float | None = None, pg_timeout_s: float = 120.0):
        if not process_on_nodes or any(not isinstance(n, int) or n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be a non-empty list of positive ints (processes per node), "
                             f"got {process_on_nodes!r}")
        if not isinstance(max_colocate_count, int) or max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be an int >= 1, got {max_colocate_count!r}")
        if num_cpus_per_process is not None and num_cpus_per_process <= 0:
            raise ValueError(f"num_cpus_per_process must be > 0, got {num_cpus_per_process}")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = max_colocate_count
        self.name_prefix = name_prefix
        self.num_cpus_per_process = num_cpus_per_process
        self.pg_timeout_s = pg_timeout_s
        self._pgs: list[PlacementGroup] | None = None
        self._bundle_cpus: float | None = None

    @property
    def world_size(self) -> int:
        """Total number of processes."""
        return sum(self.process_on_nodes)

    @property
    def store(self) -> list[int]:
        """veRL's name for ``process_on_nodes``."""
        return self.process_on_nodes

    @property
    def bundle_cpus(self) -> float:
        """CPUs reserved per bundle (known once the placement groups exist)."""
        self.get_placement_groups()
        assert self._bundle_cpus is not None
        return self._bundle_cpus

    def actor_resources(self) -> dict[str, float]:
        """``num_cpus`` / ``num_gpus`` options for one actor in a bundle."""
        res = {"num_cpus": self.bundle_cpus / self.max_colocate_count}
        if self.use_gpu:
            res["num_gpus"] = 1.0 / self.max_colocate_count
        return res

    def get_placement_groups(self) -> list[PlacementGroup]:
        """Create (once) and return one ready placement group per node entry."""
        if self._pgs is not None:
            return self._pgs
        cpus = self._cpus_per_bundle()
        bundle = {"CPU": cpus, "GPU": 1.0} if self.use_gpu else {"CPU": cpus}
        # Placement-group names are cluster-wide: a random token keeps two pools of one shape apart.
        name = f"{self.name_prefix}hybrid_rl_pool_{'_'.join(map(str, self.process_on_nodes))}_{secrets.token_hex(3)}"
        pgs = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK", name=f"{name}:{i}")
               for i, n in enumerate(self.process_on_nodes)]
        if not all(pg.wait(self.pg_timeout_s) for pg in pgs):
            for pg in pgs:
                remove_placement_group(pg)
            raise RuntimeError(
                f"the Ray cluster could not reserve {self.process_on_nodes} processes with {bundle} each within "
                f"{self.pg_timeout_s} s (available now: {ray.available_resources()}). Lower "
                f"trainer.n_gpus_per_node / nnodes (or num_cpus_per_process), free the resources held by other "
                f"jobs, or add nodes")
        self._pgs, self._bundle_cpus = pgs, cpus
        return pgs

    def remove(self) -> None:
        """Release the placement groups (kill the actors in them first)."""
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None

    def _cpus_per_bundle(self) -> float:
        if self.num_cpus_per_process is not None:
            return float(self.num_cpus_per_process)
        if self.use_gpu:
            return float(self.max_colocate_count)
        available = ray.available_resources().get("CPU", 0.0)
        if available <= 0:
            raise RuntimeError(f"the Ray cluster has no free CPU for a CPU worker group "
                               f"(cluster: {ray.cluster_resources()}); pass num_cpus_per_process or free CPUs")
        per_process = available / self.world_size
        # Whole cores when there are enough, so torch gets an integer thread count.
        return float(int(per_process)) if per_process >= 1 else round(per_process, 4)
