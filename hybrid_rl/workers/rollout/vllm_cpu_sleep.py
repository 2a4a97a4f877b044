"""Free the vLLM-CPU engine's KV cache while the worker trains: the CPU form of ``free_cache_engine``.

vLLM's sleep mode (``LLM.sleep``) exists on GPUs only: its allocator hands CUDA memory back and
forth. On CPU the engine holds its whole KV cache for the run, including the actor update, where
the colocated worker peaks (the default run's 0.53 GiB cache is 10% of that peak).

The cache of vLLM-CPU is one zero-filled tensor storage; every attention layer holds views of it.
:func:`release_kv_cache` resizes that storage to 0 bytes (the memory goes back to the allocator,
so the update's activations can reuse it) and keeps the storage objects, so every view stays
valid; :func:`restore_kv_cache` resizes them back and zero-fills them, as vLLM's allocation does.
The caller then resets the prefix cache: no block cached before the release may be reused. A
generate call after a restore gives the same tokens as one on the untouched engine (tested).

Both run inside the engine's worker (``LLM.collective_rpc``), which keeps the released storages.

The weights can go too, when a weight sync follows every wake (the hybrid engine's actor syncs
after each update anyway). vLLM-CPU prepacks each linear layer's weight into a oneDNN (or sgl)
buffer held by the closure ``layer.cpu_linear`` and empties the parameter, so the prepacked buffers
are the engine's weights (~2 bytes per parameter in bf16). :func:`release_linear_weights` drops
those closures; vLLM's ``reload_weights``, which every ``update_weights`` runs, re-processes every
layer and builds them again. The parameters that stay tensors (the embedding, which a tied LM head
shares, and the norms: 0.05 GiB in bf16 for SmolLM2-135M, 0.11 in fp32) have their storages
emptied the same way as the cache's and re-allocated by :func:`restore_released_parameters` before
the reload writes them.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

_KEPT = "_hybrid_rl_released_kv"
"""Attribute of the vLLM worker that holds ``[(storage, bytes)]`` while the cache is released."""
_KEPT_PARAMS = "_hybrid_rl_released_params"
"""Attribute of the vLLM worker that holds ``[(storage, bytes)]`` of the released parameters."""


def flatten_tensors(items: Any) -> Iterator[torch.Tensor]:
    """The tensors of a (nested) list, tuple or dict, e.g. the model runner's per-layer KV caches."""
    if isinstance(items, torch.Tensor):
        yield items
    elif isinstance(items, dict):
        for value in items.values():
            yield from flatten_tensors(value)
    elif isinstance(items, (list, tuple)):
        for value in items:
            yield from flatten_tensors(value)


def _storages(worker: Any) -> list[torch.UntypedStorage]:
    """The distinct storages behind the model runner's KV cache tensors."""
    runner = getattr(worker, "worker", worker).model_runner
    found: dict[int, torch.UntypedStorage] = {}
    for tensor in flatten_tensors(getattr(runner, "kv_caches", [])):
        storage = tensor.untyped_storage()
        if storage.nbytes():
            found.setdefault(storage.data_ptr(), storage)
    return list(found.values())


def _empty(storages: Iterable[torch.UntypedStorage]) -> list[tuple[torch.UntypedStorage, int]]:
    """Resize each storage to 0 bytes (its tensors stay valid); returns ``[(storage, bytes)]``."""
    kept = [(storage, storage.nbytes()) for storage in storages]
    for storage, _ in kept:
        storage.resize_(0)
    return kept


def _refill(kept: list[tuple[torch.UntypedStorage, int]]) -> int:
    """Re-allocate and zero-fill what :func:`_empty` emptied; returns the bytes restored."""
    for storage, nbytes in kept:
        storage.resize_(nbytes)
        torch.empty(0, dtype=torch.uint8).set_(storage).zero_()  # [nbytes] uint8 view, zeroed in place
    return sum(nbytes for _, nbytes in kept)


def release_kv_cache(worker: Any) -> int:
    """Free the KV cache's memory, keeping its tensors; returns the bytes freed (0 if already freed)."""
    if getattr(worker, _KEPT, None):
        return 0
    kept = _empty(_storages(worker))
    setattr(worker, _KEPT, kept)
    return sum(nbytes for _, nbytes in kept)


def _released_linear(x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    raise RuntimeError("this vLLM-CPU linear layer's prepacked weights were released while the engine "
                       "slept; update_weights() rebuilds them")


def release_linear_weights(worker: Any) -> int:
    """Drop the prepacked weights of vLLM-CPU's linear layers (their ``cpu_linear`` closures) and
    empty the storages of the other parameters; returns how many linear layers released theirs.
    Generating needs ``update_weights`` first (which calls :func:`restore_released_parameters`)."""
    runner = getattr(worker, "worker", worker).model_runner
    released = 0
    for module in runner.model.modules():
        if getattr(module, "cpu_linear", None) not in (None, _released_linear):
            module.cpu_linear = _released_linear
            released += 1
    storages: dict[int, torch.UntypedStorage] = {}
    for param in runner.model.parameters():  # a tied head shares the embedding's storage: once
        storage = param.untyped_storage()
        if storage.nbytes():
            storages.setdefault(storage.data_ptr(), storage)
    setattr(worker, _KEPT_PARAMS, (getattr(worker, _KEPT_PARAMS, None) or []) + _empty(storages.values()))
    return released


def restore_released_parameters(worker: Any) -> int:
    """Re-allocate the parameter storages :func:`release_linear_weights` emptied (zero-filled; the
    weight reload that must follow writes them); returns the bytes restored (0: none released)."""
    restored = _refill(getattr(worker, _KEPT_PARAMS, None) or [])
    setattr(worker, _KEPT_PARAMS, None)
    return restored


def restore_kv_cache(worker: Any) -> int:
    """Re-allocate and zero-fill what :func:`release_kv_cache` freed; returns the bytes restored."""
    restored = _refill(getattr(worker, _KEPT, None) or [])
    setattr(worker, _KEPT, None)
    return restored
