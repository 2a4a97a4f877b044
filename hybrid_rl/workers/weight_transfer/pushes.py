"""The driver's side of the lifecycle: which pushes are offered, and when their buckets are freed."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Optional

from hybrid_rl.workers.weight_transfer.handle import TRANSPORTS, WeightHandle

__all__ = ["PushLedger", "choose_transport"]

logger = logging.getLogger(__name__)


def choose_transport(exporter_node: Optional[str], reader_nodes: Iterable[Optional[str]], forced: str = "auto") -> str:
    """``forced`` when it names a transport; else ``"shm"`` when every reader is on the exporter's
    host (by address: ``/dev/shm`` is per host; a host unknown: the reader checks and says so),
    else ``"object_store"``."""
    if forced != "auto":
        if forced not in TRANSPORTS:
            raise ValueError(f"weight transfer: transport {forced!r} is not one of ('auto',) + {TRANSPORTS}. "
                             "Fix: use 'auto' (shm on one node, the object store across nodes).")
        return forced
    nodes = set(reader_nodes)
    if exporter_node is None or None in nodes or nodes <= {exporter_node}:
        return "shm"
    return "object_store"


class PushLedger:
    """Pushes offered to the rollout pool, in order. A loaded push frees its buckets and those of
    every older push (a newer offer replaced them before they were loaded).

    Args:
        release: the trainer group's ``release_rollout_weights`` (non-blocking: it returns a future,
            so the rollout never waits for a training step to free memory).
    """

    def __init__(self, release: Callable[[WeightHandle], Any]):
        self._release = release
        self._offered: list[WeightHandle] = []
        self._futures: list[Any] = []
        self._lock = threading.Lock()

    def offered(self, handle: WeightHandle) -> WeightHandle:
        with self._lock:
            self._offered.append(handle)
        return handle

    def loaded(self, handle: WeightHandle) -> None:
        """``handle`` was loaded by every rollout worker (or failed to load): free it and older pushes."""
        with self._lock:
            ids = [h.push_id for h in self._offered]
            cut = ids.index(handle.push_id) + 1 if handle.push_id in ids else 0
            done, self._offered = (self._offered[:cut] or [handle]), self._offered[cut:]
        self._free(done)

    def release_all(self) -> None:
        """Free every push not loaded yet and wait for the frees (end of training). A trainer that
        is gone cannot free anything: logged, never raised (its segments are swept at the next start)."""
        with self._lock:
            done, self._offered = self._offered, []
        self._free(done)
        futures, self._futures = self._futures, []
        for future in futures:
            try:
                if hasattr(future, "get"):
                    future.get()
            except Exception as error:  # noqa: BLE001 - teardown after a failure must not mask it
                logger.warning("weight transfer: a push could not be released: %s", error)

    @property
    def pending(self) -> list[int]:
        """Push ids offered and not freed yet."""
        with self._lock:
            return [h.push_id for h in self._offered]

    def _free(self, handles: list[WeightHandle]) -> None:
        for handle in handles:
            try:
                future = self._release(handle)
            except Exception as error:  # noqa: BLE001 - a dead trainer: the next start sweeps its segments
                logger.warning("weight transfer: push %d could not be released: %s", handle.push_id, error)
                continue
            with self._lock:
                self._futures = [f for f in self._futures if not (hasattr(f, "done") and f.done())] + [future]
