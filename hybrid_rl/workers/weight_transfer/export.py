"""The exporting side: write each unique gathered tensor once into flat byte buckets.

Host copies per push, from the gathered full tensor to what the rollout engine reads:

* ``shm``: one (the tensor is copied straight into the shared-memory bucket; the receiver reads
  the same pages through its mapping);
* ``object_store``: two (into a numpy bucket, then ``ray.put`` into the object store; a reader on
  another node gets it over the network, one on the store's node reads it in place).

Today's path (``ray.put`` of the ``(name, tensor)`` list) makes at least three: the host copy,
the pickled bytes in the store and the unpickled tensors of every reader.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from hybrid_rl.workers.weight_transfer.handle import TRANSPORTS, TensorEntry, WeightHandle
from hybrid_rl.workers.weight_transfer.shm import (SHM_DIR, create_segment, recycle_segment, sweep_dead_segments,
                                                  unlink_segment)

__all__ = ["DEFAULT_BUCKET_BYTES", "WeightExporter", "alias_groups", "node_address", "rollout_aliases"]

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 << 20
_ALIGN = 64  # every tensor starts on a cache line (and on any element size)


def node_address() -> Optional[str]:
    """This host's address as Ray sees it, or None outside Ray. The host, not the Ray node id: several
    raylets on one host (``ray.cluster_utils.Cluster``) share its ``/dev/shm``."""
    try:
        import ray
    except ImportError:
        return None
    return ray.util.get_node_ip_address() if ray.is_initialized() else None


def alias_groups(module: torch.nn.Module, rename: Optional[Callable[[str], str]] = None) -> dict[str, str]:
    """``{alias: first name}`` for the state-dict entries that share another entry's storage (tied
    embeddings), keyed by the un-gathered local tensor, so FSDP shards count as well."""
    first: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.numel() == 0:
            continue
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape),
               local.stride(), local.dtype)
        out_name = rename(name) if rename is not None else name
        if key in first:
            aliases[out_name] = first[key]
        else:
            first[key] = out_name
    return aliases


def rollout_aliases(module: torch.nn.Module) -> dict[str, str]:
    """:func:`alias_groups` under the names the rollout stream uses (a LoRA model's HF names)."""
    from hybrid_rl.workers.lora import _hf_name, is_lora_model  # the names merged_lora_weights yields

    return alias_groups(module, _hf_name if is_lora_model(module) else None)


class _Buckets:
    """Fills buckets of ``bucket_bytes`` (a larger tensor gets a bucket of its own size)."""

    def __init__(self, transport: str, bucket_bytes: int, shm_dir: str, spares: Optional[list[str]] = None):
        self.transport, self.bucket_bytes, self.shm_dir = transport, bucket_bytes, shm_dir
        self.spares = spares or []  # released segments to write into first
        self.sealed: list[Any] = []  # shm paths or ObjectRefs
        self.sizes: list[int] = []
        self._open: Any = None  # (path, mmap) or a numpy array
        self._view: Optional[torch.Tensor] = None  # uint8 view of the open bucket
        self._used = 0

    def write(self, tensor: torch.Tensor) -> tuple[int, int]:
        """Copy ``tensor``'s bytes into a bucket; returns (bucket index, byte offset)."""
        nbytes = tensor.numel() * tensor.element_size()
        start = -(-self._used // _ALIGN) * _ALIGN
        if self._view is None or start + nbytes > self._view.numel():
            self._seal()
            self._start(max(self.bucket_bytes, nbytes))
            start = 0
        if nbytes:
            src = tensor.reshape(-1).view(torch.uint8)  # [nbytes]
            self._view[start:start + nbytes].copy_(src)
        self._used = start + nbytes
        return len(self.sealed), start

    def _start(self, capacity: int) -> None:
        if self.transport == "shm":
            path, mapping = create_segment(capacity, self.shm_dir, self.spares.pop() if self.spares else None)
            self._open = (path, mapping)
            self._view = torch.frombuffer(mapping, dtype=torch.uint8)
        else:
            self._open = np.empty(capacity, dtype=np.uint8)
            self._view = torch.from_numpy(self._open)
        self._used = 0

    def _seal(self) -> None:
        if self._open is None:
            return
        self._view = None  # drop the tensor before the mapping it points into
        if self.transport == "shm":
            path, mapping = self._open
            mapping.close()  # the file keeps its capacity (and pages) for reuse; readers map the used part
            self.sealed.append(path)
        else:
            import ray
            self.sealed.append(ray.put(self._open[:self._used]))  # numpy: stored out of band, not pickled
        self.sizes.append(self._used)
        self._open = None

    def finish(self) -> None:
        self._seal()

    def discard(self) -> None:
        """Undo a failed push: unlink every segment written so far."""
        self._view = None
        if self.transport == "shm":
            if self._open is not None:
                self._open[1].close()
                self.sealed.append(self._open[0])
            for path in self.sealed + self.spares:
                unlink_segment(path)
        self._open = None
        self.sealed, self.spares = [], []


class WeightExporter:
    """Writes pushes of the trainer's weights and keeps their buckets alive until released.

    Args:
        shm_dir: where shared-memory buckets live (``/dev/shm``); leftovers of dead exporters
            there are swept when the exporter is created.
    """

    def __init__(self, shm_dir: str = SHM_DIR):
        self.shm_dir = shm_dir
        sweep_dead_segments(shm_dir)
        self._live: dict[int, tuple[str, list[Any]]] = {}  # push id -> (transport, buckets)
        self._next_push = 0
        self._spares: list[str] = []  # the last released push's segments, renamed, for the next push
        self._pinned: Optional[tuple[WeightHandle, list[Any]]] = None  # a LoRA actor's base weights
        self._lock = threading.Lock()
        atexit.register(self.close)  # a graceful exit unlinks; a killed one is swept by the next exporter

    def export(self, named_tensors: Iterable[tuple[str, torch.Tensor]], aliases: dict[str, str],
               transport: str = "shm", bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightHandle:
        """Consume the ``(name, full tensor)`` stream (to its end: it may be a collective) and write
        every tensor once; an alias of a name already written is only recorded under that tensor."""
        if transport not in TRANSPORTS:
            raise ValueError(f"weight transfer: transport {transport!r} is not one of {TRANSPORTS}. Fix: use "
                             "'shm' on one node or 'object_store' across nodes.")
        if bucket_bytes <= 0:
            raise ValueError(f"weight transfer: bucket_bytes ({bucket_bytes}) must be positive. Fix: use e.g. "
                             f"{DEFAULT_BUCKET_BYTES} (512 MiB).")
        with self._lock:
            spares, self._spares = (self._spares, []) if transport == "shm" else ([], self._spares)
        buckets = _Buckets(transport, bucket_bytes, self.shm_dir, spares)
        names: list[list[str]] = []
        layout: list[tuple[str, tuple[int, ...], int, int, int]] = []
        where: dict[str, int] = {}
        order: list[str] = []
        try:
            for name, tensor in named_tensors:
                order.append(name)
                first = aliases.get(name)
                if first is not None and first in where:
                    names[where[first]].append(name)
                    continue
                tensor = tensor.detach().contiguous()
                bucket, offset = buckets.write(tensor)
                where[name] = len(names)
                names.append([name])
                layout.append((str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), bucket, offset,
                               tensor.numel() * tensor.element_size()))
            buckets.finish()
            for path in buckets.spares:  # more spares than this push needed
                unlink_segment(path)
        except BaseException:
            buckets.discard()
            raise
        entries = tuple(TensorEntry(tuple(n), *fields) for n, fields in zip(names, layout))
        with self._lock:
            push_id, self._next_push = self._next_push, self._next_push + 1
            self._live[push_id] = (transport, list(buckets.sealed))
        return WeightHandle(push_id, transport, tuple(buckets.sealed), tuple(buckets.sizes), entries,
                            node_address(), tuple(order))

    def release(self, handle: WeightHandle) -> int:
        """Free a push's buckets; returns how many (0 when the push was released already). Object
        refs are dropped; shm segments are renamed (the handle's names are gone at once) and kept
        for the next push to write into, whose pages then need no allocation: at most one push's
        segments are kept, the older spares are unlinked."""
        with self._lock:
            transport, buckets = self._live.pop(handle.push_id, ("", []))
        if transport == "shm":
            recycled = [fresh for fresh in map(recycle_segment, buckets) if fresh is not None]
            with self._lock:
                older, self._spares = self._spares, recycled
            for path in older:
                unlink_segment(path)
        return len(buckets)

    def pin(self, handle: WeightHandle) -> None:
        """Keep ``handle``'s buckets until :meth:`close` (or the next pin): a LoRA actor's base weights,
        read by every later adapters-only push. :meth:`release` no longer frees them; a previously
        pinned push is freed now."""
        with self._lock:
            transport, buckets = self._live.pop(handle.push_id, ("", []))
            if transport != handle.transport:
                raise ValueError(f"weight transfer: push {handle.push_id} is not alive in this exporter. Fix: pin "
                                 "a handle this exporter returned, before releasing it.")
            older, self._pinned = self._pinned, (handle, buckets)
        if older is not None and older[0].transport == "shm":
            for path in older[1]:
                unlink_segment(path)

    @property
    def pinned(self) -> Optional[WeightHandle]:
        """The pinned push (a LoRA actor's base weights), if any."""
        with self._lock:
            return self._pinned[0] if self._pinned is not None else None

    @property
    def live_pushes(self) -> list[int]:
        """Ids of the pushes not released yet."""
        with self._lock:
            return sorted(self._live)

    def close(self) -> None:
        """Unlink every push still alive and the spare segments (worker shutdown)."""
        with self._lock:
            pushes, self._live = list(self._live.values()), {}
            pushes.append(("shm", self._spares))
            if self._pinned is not None:
                pushes.append((self._pinned[0].transport, self._pinned[1]))
            self._spares, self._pinned = [], None
        for transport, buckets in pushes:
            if transport == "shm":
                for path in buckets:
                    unlink_segment(path)
