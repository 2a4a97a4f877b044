"""The metadata of one weight push: plain Python data only (it is what crosses Ray)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["TRANSPORTS", "TensorEntry", "WeightHandle"]

TRANSPORTS = ("shm", "object_store")


@dataclass(frozen=True)
class TensorEntry:
    """Where one unique tensor lies in the buckets, and every name that shares it."""

    names: tuple[str, ...]
    """State-dict names of this tensor, in export order (tied weights: more than one)."""
    dtype: str
    """torch dtype name without the ``torch.`` prefix, e.g. ``"bfloat16"``."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""
    bucket: int
    """Index into ``WeightHandle.buckets``."""
    offset: int
    """Byte offset of the first element inside the bucket."""
    nbytes: int
    """Bytes of the tensor (``numel * element size``)."""


@dataclass(frozen=True)
class WeightHandle:
    """One push of the trainer's weights, as the driver hands it from the trainer to the rollout pool."""

    push_id: int
    """Counter of the exporting process, unique per push."""
    transport: str
    """``"shm"`` (shared-memory files on the exporter's node) or ``"object_store"`` (Ray numpy buckets)."""
    buckets: tuple[Any, ...]
    """Per bucket: the ``/dev/shm`` file path (shm) or the Ray ``ObjectRef`` of a uint8 array."""
    bucket_sizes: tuple[int, ...]
    """Bytes of each bucket."""
    entries: tuple[TensorEntry, ...]
    """The unique tensors, in export order."""
    node_ip: Optional[str] = None
    """Address of the exporter's host (None outside Ray); shm buckets are readable only there."""
    order: tuple[str, ...] = field(default=())
    """Every exported name in the trainer's stream order (aliases included)."""

    @property
    def num_bytes(self) -> int:
        """Bytes of the unique tensors (tied weights counted once)."""
        return sum(e.nbytes for e in self.entries)
