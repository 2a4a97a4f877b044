"""The metadata of one weight push: plain Python data only (it is what crosses Ray)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["TRANSPORTS", "LoraAdapter", "TensorEntry", "WeightHandle"]

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
class LoraAdapter:
    """What turns an adapters-only push of a LoRA actor into the merged weights the engine loads."""

    r: int
    """The adapters' rank (``actor_rollout_ref.model.lora_rank``)."""
    lora_alpha: float
    """peft's ``lora_alpha``."""
    target_modules: tuple[str, ...]
    """The adapted module names as configured (``("all-linear",)`` for all linear layers)."""
    scalings: tuple[tuple[str, float], ...]
    """Per adapted layer: its base weight's HF name and peft's scaling (``lora_alpha / r``)."""
    dtype: str
    """dtype of the merged weights (the rollout dtype), torch name without the ``torch.`` prefix."""
    base: "WeightHandle"
    """The base weights (every non-adapter tensor under its HF name), written by the actor's first push
    and pinned until its exporter closes: each load reads them, so an engine that lost its weights
    (a restart, a sleep) gets them back from any later push."""
    carries_base: bool = False
    """True for the push that wrote ``base`` (its bytes count for that push only)."""


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
    lora: Optional[LoraAdapter] = None
    """Set for a LoRA actor's adapters-only push: ``entries`` then hold the adapter factors alone
    (peft's saved-adapter names, e.g. ``base_model.model.model.layers.0.mlp.up_proj.lora_A.weight``)."""

    @property
    def num_bytes(self) -> int:
        """Bytes of the unique tensors (tied weights counted once)."""
        return sum(e.nbytes for e in self.entries)
