"""The receiving side: map a push's buckets and yield zero-copy ``(name, tensor)`` views."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Iterator

import torch

from hybrid_rl.workers.weight_transfer.export import node_address
from hybrid_rl.workers.weight_transfer.handle import TensorEntry, WeightHandle
from hybrid_rl.workers.weight_transfer.shm import map_readonly

__all__ = ["open_weights"]

logger = logging.getLogger(__name__)


def _map_buckets(handle: WeightHandle) -> list[Any]:
    if handle.transport == "shm":
        here = node_address()
        if handle.node_ip is not None and here is not None and here != handle.node_ip:
            raise ValueError(f"weight transfer: push {handle.push_id} lies in shared memory on host "
                             f"{handle.node_ip} but this rollout worker runs on host {here}. Fix: export with "
                             "transport='object_store' when the rollout pool spans other nodes.")
        return [map_readonly(path, size) for path, size in zip(handle.buckets, handle.bucket_sizes)]
    import ray
    return ray.get(list(handle.buckets))  # uint8 numpy arrays, read in place on this node's store


def _view(buffer: Any, entry: TensorEntry) -> torch.Tensor:
    dtype = getattr(torch, entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    with warnings.catch_warnings():  # the object store's arrays are read-only: the engines only read them
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
    return raw.view(dtype).view(entry.shape)


def _named_views(handle: WeightHandle, buffers: list[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    by_name = {name: entry for entry in handle.entries for name in entry.names}
    for name in handle.order or [n for e in handle.entries for n in e.names]:
        entry = by_name[name]
        yield name, _view(buffers[entry.bucket], entry)


@contextlib.contextmanager
def open_weights(handle: WeightHandle) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """Map ``handle``'s buckets; yields an iterator of ``(name, view)`` in the trainer's order (every
    alias of a tied tensor included). Views are valid inside the ``with`` only: load them there.
    An adapters-only LoRA push (``handle.lora``) yields its pinned base's stream with the adapters
    merged into the adapted weights (:func:`~hybrid_rl.workers.weight_transfer.adapters.apply_adapters`)."""
    if not isinstance(handle, WeightHandle):
        raise ValueError(f"weight transfer: expected a WeightHandle from export_rollout_weights, got "
                         f"{type(handle).__name__}. Fix: pass the trainer's export_rollout_weights()[0]['weights'].")
    with _mapped(handle) as buffers:
        if handle.lora is None:
            yield _named_views(handle, buffers)
            return
        from hybrid_rl.workers.weight_transfer.adapters import apply_adapters

        with _mapped(handle.lora.base) as base_buffers:
            adapters = dict(_named_views(handle, buffers))
            yield apply_adapters(_named_views(handle.lora.base, base_buffers), adapters, handle.lora)


@contextlib.contextmanager
def _mapped(handle: WeightHandle) -> Iterator[list[Any]]:
    """``handle``'s buckets mapped (shm) or fetched (object store) for the ``with`` body."""
    buffers = _map_buckets(handle)
    try:
        yield buffers
    finally:
        for buffer in buffers:
            if hasattr(buffer, "close"):
                try:
                    buffer.close()
                except BufferError:  # a view outlived the load: the mapping goes with its last view
                    logger.debug("weight transfer: a view of push %d is still referenced", handle.push_id)
