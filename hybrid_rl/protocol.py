"""DataProto: the one batch type that crosses the driver / worker boundary.

A batch has three parts (same API and semantics as veRL's ``DataProto``):

* ``batch``: a ``tensordict.TensorDict`` whose tensors all share dim 0 (the rows),
* ``non_tensor_batch``: ``dict[str, np.ndarray]`` (object arrays allowed) of the same length,
* ``meta_info``: a plain dict of batch-wide values (``eos_token_id``, ``temperature``, ``metrics``...).

Key names are listed in :mod:`hybrid_rl.schema`.

Auto-padding (as in veRL): ``chunk(n)`` requires ``len % n == 0`` unless padding is enabled, either
per batch (``from_dict(..., auto_padding=True)`` sets ``meta_info[AUTO_PADDING_KEY]``) or globally
(``DataProtoConfig.auto_padding = True``). With padding enabled, ``chunk`` returns ``n`` chunks whose
sizes differ by at most one (the first ``len % n`` chunks get one extra row). The worker-group
dispatcher instead pads explicitly with :func:`pad_dataproto_to_divisor` and removes the padding
from the gathered result with :func:`unpad_dataproto`.

Pickling (used by Ray) ships each tensor as one contiguous numpy array, so serialization cost is a
memory copy per key, never a Python loop over rows. Unpickled batches live on CPU.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from tensordict import TensorDict

from hybrid_rl import protocol_utils as pu

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoItem",
    "collate_fn",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
]

logger = logging.getLogger(__name__)

AUTO_PADDING_KEY = "_auto_padding"
"""meta_info flag that lets ``chunk`` split a batch whose length is not a multiple of the chunk count."""


class DataProtoConfig:
    """Process-wide switch: ``DataProtoConfig.auto_padding = True`` enables padding for every DataProto."""

    auto_padding: bool = False


@dataclass
class DataProtoItem:
    """One row of a DataProto (what ``data[i]`` returns): ``batch`` is a TensorDict with batch_size ()."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def _index_batch(batch: TensorDict | None, index: Any, num_rows: int) -> TensorDict | None:
    if batch is None:
        return None
    return TensorDict({k: v[index] for k, v in batch.items()}, batch_size=[num_rows], device=batch.device)


@dataclass(eq=False)
class DataProto:
    """A batch of rows: tensors (``batch``), numpy arrays (``non_tensor_batch``) and ``meta_info``."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor] | None = None, non_tensors: dict[str, Any] | None = None,
                  meta_info: dict[str, Any] | None = None, auto_padding: bool = False) -> DataProto:
        """Build from ``{name: tensor [B, ...]}`` and ``{name: np.ndarray | list of length B}``.

        Lists become 1-D object arrays (one element per row, even when rows are equal-length lists).
        """
        tensors, meta_info = dict(tensors or {}), dict(meta_info or {})
        non_tensor_batch = {}
        for key, value in (non_tensors or {}).items():
            if isinstance(value, np.ndarray):
                non_tensor_batch[key] = value
            elif isinstance(value, (list, tuple)):
                non_tensor_batch[key] = pu.to_object_array(value)
            else:
                raise ValueError(f"non_tensors[{key!r}] must be a numpy array or a list, got {type(value).__name__}")
        batch = None
        if tensors:
            first_key = next(iter(tensors))
            for key, value in tensors.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0:
                    raise ValueError(f"tensors[{key!r}] must be a torch.Tensor with a batch dim, got {value!r:.80}")
                if value.shape[0] != tensors[first_key].shape[0]:
                    raise ValueError(f"tensor {key!r} has {value.shape[0]} rows but {first_key!r} has "
                                     f"{tensors[first_key].shape[0]}; all tensors must share dim 0")
            batch = TensorDict(tensors, batch_size=[tensors[first_key].shape[0]])
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None,
                         auto_padding: bool = False) -> DataProto:
        """Build from one dict: tensors go to ``batch``; numpy arrays and lists to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise ValueError(f"data[{key!r}] has unsupported type {type(value).__name__}; "
                                 "use a torch.Tensor, a numpy array or a list with one entry per row")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Raise ValueError unless every tensor and non-tensor array has ``len(self)`` rows."""
        if self.batch is not None and len(self.batch.batch_size) != 1:
            raise ValueError(f"batch must have exactly one batch dim, got batch_size={tuple(self.batch.batch_size)}")
        expected, source = (len(self), "batch") if self.batch is not None else (None, None)
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise ValueError(f"non_tensor_batch[{key!r}] must be a numpy array, got {type(value).__name__}; "
                                 "wrap lists with DataProto.from_dict which converts them to object arrays")
            if value.ndim == 0:
                raise ValueError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row")
            if expected is None:
                expected, source = value.shape[0], f"non_tensor_batch[{key!r}]"
            elif value.shape[0] != expected:
                raise ValueError(f"non_tensor_batch[{key!r}] has length {value.shape[0]} but {source} has "
                                 f"length {expected}; every key needs one entry per row")

    # ----------------------------------------------------------------------------- basics
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __getitem__(self, item: Any) -> DataProto | DataProtoItem:
        """``int`` -> :class:`DataProtoItem`; slice, index list/array/tensor or bool mask -> DataProto."""
        if isinstance(item, (int, np.integer)):
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"row {item} out of range for a DataProto of {n} rows")
            return DataProtoItem(
                batch=self.batch[int(item)] if self.batch is not None else None,
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(f"DataProto indices must be int, slice, list, numpy array or tensor, not {type(item).__name__}")

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a new DataProto (tensors are views; meta_info is shared)."""
        sl = slice(start, end, step)
        batch = self.batch[sl] if self.batch is not None else None
        non_tensor = {k: v[sl] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def select_idxs(self, idxs: list | tuple | np.ndarray | torch.Tensor) -> DataProto:
        """Rows at integer indices (any order, repeats allowed) or where a bool mask of length ``len`` is True."""
        idxs_np = idxs.detach().cpu().numpy() if isinstance(idxs, torch.Tensor) else np.asarray(idxs)
        if idxs_np.size == 0:
            idxs_np = idxs_np.astype(np.int64)
        if idxs_np.dtype == bool:
            if idxs_np.shape != (len(self),):
                raise ValueError(f"bool mask has shape {idxs_np.shape}, expected ({len(self)},)")
            idxs_np = np.flatnonzero(idxs_np)
        if idxs_np.ndim != 1 or idxs_np.dtype.kind not in "iu":
            raise ValueError(f"indices must be a 1-D integer or bool sequence, got dtype {idxs_np.dtype} "
                             f"and shape {idxs_np.shape}")
        idxs_t = torch.from_numpy(idxs_np.astype(np.int64))
        batch = _index_batch(self.batch, idxs_t, len(idxs_np))
        non_tensor = {k: v[idxs_np] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def to(self, device: str | torch.device) -> DataProto:
        """Move ``batch`` to ``device`` in place and return self (numpy parts stay on the host)."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # ----------------------------------------------------------------------------- keys
    def select(self, batch_keys: list[str] | None = None, non_tensor_batch_keys: list[str] | None = None,
               meta_info_keys: list[str] | None = None, deepcopy: bool = False) -> DataProto:
        """New DataProto with only the given keys (``None`` keeps all keys of that part).

        Without ``deepcopy`` the tensors/arrays are shared with self; with it everything is copied.
        """
        batch = self.batch
        if batch_keys is not None:
            _require_keys(batch_keys, self.batch.keys() if self.batch is not None else [], "batch")
            batch = self.batch.select(*batch_keys)
        non_tensor = _subset(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = _subset(self.meta_info, meta_info_keys, "meta_info")
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(self, batch_keys: list[str] | None = None, non_tensor_batch_keys: list[str] | None = None,
            meta_info_keys: list[str] | None = None) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto."""
        _require_keys(batch_keys or [], self.batch.keys() if self.batch is not None else [], "batch")
        _require_keys(non_tensor_batch_keys or [], self.non_tensor_batch, "non_tensor_batch")
        _require_keys(meta_info_keys or [], self.meta_info, "meta_info")
        tensors = {k: self.batch.pop(k) for k in batch_keys or []}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or []}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys or []}
        return type(self).from_dict(tensors, non_tensors, meta)

    def rename(self, old_keys: str | list[str], new_keys: str | list[str]) -> DataProto:
        """Rename keys of ``batch`` or ``non_tensor_batch`` in place; returns self."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename got {len(old_keys)} old keys but {len(new_keys)} new keys")
        tensor_keys = set(self.batch.keys()) if self.batch is not None else set()
        all_keys = tensor_keys | set(self.non_tensor_batch)
        for old, new in zip(old_keys, new_keys):
            if old not in all_keys:
                raise ValueError(f"cannot rename {old!r}: no such key (have {sorted(all_keys)})")
            if new in all_keys and new != old:
                raise ValueError(f"cannot rename {old!r} to {new!r}: {new!r} already exists")
            if old in tensor_keys:
                self.batch.rename_key_(old, new)
            else:
                self.non_tensor_batch[new] = self.non_tensor_batch.pop(old)
            all_keys = (all_keys - {old}) | {new}
            tensor_keys = (tensor_keys - {old}) | ({new} if old in tensor_keys else set())
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s keys to self in place (returns self); shared keys must hold equal values."""
        if _has_rows(self) and _has_rows(other) and len(self) != len(other):
            raise ValueError(f"cannot union DataProtos of {len(self)} and {len(other)} rows")
        if other.batch is not None:
            if self.batch is None:
                self.batch = TensorDict({}, batch_size=other.batch.batch_size, device=other.batch.device)
            _union_into(self.batch, other.batch, "batch")
        _union_into(self.non_tensor_batch, other.non_tensor_batch, "non_tensor_batch")
        _union_into(self.meta_info, other.meta_info, "meta_info")
        self.check_consistency()
        return self

    # ----------------------------------------------------------------------------- splitting
    def is_padding_enabled(self) -> bool:
        """True if this batch (meta_info flag) or the process (``DataProtoConfig``) allows uneven chunks."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last row, in place."""
        if padding_size <= 0:
            return
        row = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = DataProto.concat([self, row.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split rows into ``chunks`` consecutive parts; each keeps a reference to ``meta_info``.

        ``len(self) % chunks`` must be 0 unless padding is enabled (see module docstring).
        """
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        n = len(self)
        if n % chunks != 0 and not self.is_padding_enabled():
            raise ValueError(
                f"cannot chunk a DataProto of {n} rows into {chunks} equal chunks; pad it first with "
                f"pad_dataproto_to_divisor(data, {chunks}) (and unpad_dataproto after), or enable auto-padding "
                f"(DataProto.from_dict(..., auto_padding=True) or DataProtoConfig.auto_padding = True)"
            )
        sizes = [n // chunks + (1 if i < n % chunks else 0) for i in range(chunks)]
        bounds = np.cumsum([0] + sizes)
        return [self.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if not isinstance(split_size, int) or split_size <= 0:
            raise ValueError(f"split_size must be a positive int, got {split_size!r}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        """Concatenate along rows; ``meta_info`` comes from the first element except ``metrics``.

        ``meta_info["metrics"]`` of every element (a dict ``name -> value or list of values``) is
        merged into one ``name -> list`` dict, in element order, so the driver can reduce it.
        """
        if len(data) == 0:
            raise ValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        _check_same_keys(data)
        batch = None
        if first.batch is not None:
            batch = torch.cat([d.batch for d in data], dim=0)
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in first.non_tensor_batch}
        meta = dict(first.meta_info)
        # Chunks of one batch share a single metrics dict object: count it once, not once per chunk.
        all_metrics = list({id(m): m for m in (d.meta_info.get("metrics") for d in data) if m is not None}.values())
        if all_metrics:
            meta["metrics"] = pu.merge_metrics(all_metrics)
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    # ----------------------------------------------------------------------------- reordering
    def reorder(self, indices: torch.Tensor | np.ndarray | list[int]) -> DataProto:
        """Permute rows in place so that new row ``i`` is old row ``indices[i]``; returns self."""
        reordered = self.select_idxs(indices)
        if len(reordered) != len(self):
            raise ValueError(f"reorder needs {len(self)} indices, got {len(reordered)}")
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row ``repeat_times`` times: ``interleave`` gives a,a,b,b; otherwise a,b,a,b."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"repeat_times must be a positive int, got {repeat_times!r}")
        n = len(self)
        index = np.repeat(np.arange(n), repeat_times) if interleave else np.tile(np.arange(n), repeat_times)
        return self.select_idxs(index)

    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None, shuffle: bool = False,
                      dataloader_kwargs: dict[str, Any] | None = None) -> Iterator[DataProto]:
        """Yield ``epochs * len // mini_batch_size`` mini-batches; with ``shuffle`` each epoch is a fresh
        permutation drawn from a generator seeded by ``seed`` (global torch RNG if ``seed`` is None).

        ``dataloader_kwargs`` is accepted for veRL compatibility; only its ``shuffle`` key is used.
        """
        kwargs = dict(dataloader_kwargs or {})
        shuffle = bool(kwargs.pop("shuffle", shuffle))
        if kwargs:
            raise ValueError(f"make_iterator only supports dataloader_kwargs['shuffle'], got {sorted(kwargs)}")
        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise ValueError(f"mini_batch_size ({mini_batch_size}) must be positive and divide the batch "
                             f"size ({len(self)})")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None

        def _iterate() -> Iterator[DataProto]:
            for _ in range(epochs):
                order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
                for start in range(0, len(self), mini_batch_size):
                    yield self.select_idxs(order[start:start + mini_batch_size])

        return _iterate()

    # ----------------------------------------------------------------------------- io
    def __getstate__(self) -> dict[str, Any]:
        tensors = None
        if self.batch is not None:
            tensors = {k: pu.tensor_to_state(v) for k, v in self.batch.items()}
        batch_size = tuple(self.batch.batch_size) if self.batch is not None else None
        return {"tensors": tensors, "batch_size": batch_size, "non_tensor_batch": self.non_tensor_batch,
                "meta_info": self.meta_info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = None
        if state["tensors"] is not None:
            tensors = {k: pu.tensor_from_state(arr, dtype) for k, (arr, dtype) in state["tensors"].items()}
            self.batch = TensorDict(tensors, batch_size=list(state["batch_size"]))
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str) -> None:
        """Write one pickle-free safetensors file (format in :mod:`hybrid_rl.protocol_utils`).

        Non-tensor values must be None/bool/int/float/str/list/tuple/dict/numpy/tensor; others raise
        ValueError naming the key (so loading a file can never execute code).
        """
        tensors = dict(self.batch.items()) if self.batch is not None else None
        pu.save_parts(str(filepath), tensors, self.non_tensor_batch, self.meta_info)

    @staticmethod
    def load_from_disk(filepath: str) -> DataProto:
        """Read a file written by :meth:`save_to_disk` (tensors on CPU)."""
        tensors, batch_size, non_tensor, meta = pu.load_parts(str(filepath))
        batch = TensorDict(tensors, batch_size=[batch_size or 0]) if tensors is not None else None
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def get_data_info(self) -> str:
        """One line per key: name, dtype, shape (tensors) or length (non-tensors), plus meta_info keys."""
        lines = []
        if self.batch is not None:
            lines += [f"batch.{k}: {v.dtype} {tuple(v.shape)}" for k, v in self.batch.items()]
        lines += [f"non_tensor_batch.{k}: {v.dtype} {v.shape}" for k, v in self.non_tensor_batch.items()]
        lines.append(f"meta_info keys: {sorted(self.meta_info)}")
        return "\n".join(lines)

    def print_size(self, prefix: str = "") -> None:
        """Log the byte size of the tensor and numpy parts (object arrays count pointer bytes only)."""
        tensor_bytes = sum(v.numel() * v.element_size() for v in self.batch.values()) if self.batch is not None else 0
        numpy_bytes = sum(v.nbytes for v in self.non_tensor_batch.values())
        logger.info("%sbatch: %.3f MiB, non_tensor_batch: %.3f MiB", f"{prefix}, " if prefix else "",
                    tensor_bytes / 2**20, numpy_bytes / 2**20)


# --------------------------------------------------------------------------------- module helpers
def _has_rows(data: DataProto) -> bool:
    """True if ``data`` has any row-aligned part (so its length is meaningful)."""
    return data.batch is not None or bool(data.non_tensor_batch)


def _require_keys(keys: Any, available: Any, part: str) -> None:
    available = list(available)
    if isinstance(keys, str):
        raise ValueError(f"{part} keys must be a list of names, got the string {keys!r}; use [{keys!r}]")
    for key in keys:
        if key not in available:
            raise ValueError(f"key {key!r} not in {part} (have {sorted(available)})")


def _subset(mapping: dict[str, Any], keys: list[str] | None, part: str) -> dict[str, Any]:
    if keys is None:
        return dict(mapping)
    _require_keys(keys, mapping, part)
    return {k: mapping[k] for k in keys}


def _union_into(target: Any, source: Any, part: str) -> None:
    for key, value in source.items():
        if key in target.keys() and not pu.deep_equal(target[key], value):
            raise ValueError(f"union conflict: {part}[{key!r}] differs between the two DataProtos; "
                             f"rename or pop one of them before union")
        target[key] = value


def _check_same_keys(data: list[DataProto]) -> None:
    def keys_of(d: DataProto) -> tuple[set, set]:
        return (set(d.batch.keys()) if d.batch is not None else None), set(d.non_tensor_batch)

    ref = keys_of(data[0])
    for i, d in enumerate(data[1:], start=1):
        if keys_of(d) != ref:
            raise ValueError(f"concat: element {i} has keys {keys_of(d)} but element 0 has {ref}")


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by appending its leading rows (cycling if
    more padding than rows is needed). Returns ``(padded, pad_size)``; undo with :func:`unpad_dataproto`.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise ValueError("cannot pad an empty DataProto: there is no row to repeat")
    padded = DataProto.concat([data, data.select_idxs(np.arange(pad_size) % n)])
    padded.meta_info = data.meta_info
    return padded, pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (the padding added by :func:`pad_dataproto_to_divisor`)."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size must be in [0, {len(data)}], got {pad_size}")
    return data.slice(0, len(data) - pad_size) if pad_size else data


def collate_fn(items: list[DataProtoItem]) -> DataProto:
    """Stack rows (e.g. from ``data[i]``) back into a DataProto; non-tensor values become object arrays."""
    if not items:
        raise ValueError("collate_fn needs at least one item")
    batch = torch.stack([it.batch for it in items]).contiguous() if items[0].batch is not None else None
    non_tensor = {k: pu.to_object_array([it.non_tensor_batch[k] for it in items]) for k in items[0].non_tensor_batch}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(items[0].meta_info))
