"""Helpers behind :mod:`hybrid_rl.protocol`: value equality, metric merging, fast pickling state and
the pickle-free on-disk format.

Kept apart from ``protocol.py`` so that the DataProto class reads as its API; nothing here is needed
by users directly.

On-disk format (``DataProto.save_to_disk``): one ``safetensors`` file. Tensors of ``batch`` are stored
as safetensors tensors; ``non_tensor_batch`` and ``meta_info`` go into the safetensors metadata header
as JSON with a small tagged encoding (tuples, numpy arrays/scalars, tensors, non-string dict keys).
Loading never executes code (no pickle). The price: non-tensor values must be built from
None/bool/int/float/str/list/tuple/dict/numpy arrays/tensors; anything else is rejected at save
time with a ValueError naming the key.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# construction / equality
# ---------------------------------------------------------------------------------------------


def to_object_array(values: list | tuple) -> np.ndarray:
    """1-D object array with one element per entry of ``values``.

    ``np.array(values, dtype=object)`` would turn a list of equal-length lists (e.g. chat messages)
    into a 2-D array, so elements are assigned one by one.
    """
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def deep_equal(a: Any, b: Any) -> bool:
    """Structural equality that treats NaN == NaN and compares arrays/tensors element-wise."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        a, b = a.cpu(), b.cpu()
        if a.is_floating_point():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return all(deep_equal(x, y) for x, y in zip(a.flat, b.flat))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def merge_metrics(metric_dicts: list[dict]) -> dict[str, list]:
    """Merge per-worker metric dicts into ``{key: [values...]}`` in worker order.

    A value that is already a list/tuple is flattened into the key's list, so merging already merged
    dicts is associative: ``merge([merge([a, b]), c]) == merge([a, b, c])``.
    """
    merged: dict[str, list] = {}
    for metrics in metric_dicts:
        if not isinstance(metrics, dict):
            raise ValueError(
                f"meta_info['metrics'] must be a dict of metric name -> value(s), got {type(metrics).__name__}; "
                "return e.g. {'actor/pg_loss': 0.1} from the worker"
            )
        for key, value in metrics.items():
            bucket = merged.setdefault(key, [])
            if isinstance(value, (list, tuple)):
                bucket.extend(value)
            else:
                bucket.append(value)
    return merged


# ---------------------------------------------------------------------------------------------
# pickling: tensors travel as numpy arrays (pickle protocol 5 / Ray move them without copies)
# ---------------------------------------------------------------------------------------------


def tensor_to_state(tensor: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """(numpy array, original dtype name if it had to be reinterpreted) for a CPU copy of ``tensor``."""
    tensor = tensor.detach().cpu().contiguous()
    try:
        return tensor.numpy(), None
    except TypeError:
        # bfloat16 / float8 have no numpy dtype: ship the raw bytes and reinterpret on load.
        return tensor.view(torch.uint8).numpy(), str(tensor.dtype).removeprefix("torch.")


def tensor_from_state(array: np.ndarray, dtype_name: str | None) -> torch.Tensor:
    tensor = torch.from_numpy(array) if array.flags.writeable else torch.from_numpy(array.copy())
    return tensor if dtype_name is None else tensor.view(getattr(torch, dtype_name))


# ---------------------------------------------------------------------------------------------
# pickle-free JSON codec for non-tensor values and meta_info
# ---------------------------------------------------------------------------------------------

_TAG = "__hybrid_rl_type__"


def encode_value(value: Any, where: str) -> Any:
    """JSON-ready form of ``value``; ``where`` names the key for error messages."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, np.generic):
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {_TAG: "np_scalar", "dtype": value.dtype.str, "value": value.item()}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            items = [encode_value(v, where) for v in value.ravel()]
            return {_TAG: "np_object", "shape": list(value.shape), "items": items}
        if value.dtype.kind not in "biufU":
            raise ValueError(f"{where}: numpy dtype {value.dtype} cannot be saved; convert it to a numeric/str array")
        return {_TAG: "np", "dtype": value.dtype.str, "shape": list(value.shape), "data": value.tolist()}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        # bfloat16 values are exactly representable as float32, so .float() loses nothing.
        data = t.float().tolist() if t.dtype == torch.bfloat16 else t.tolist()
        return {_TAG: "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": data}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [encode_value(v, where) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, where) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: encode_value(v, where) for k, v in value.items()}
        pairs = [[encode_value(k, where), encode_value(v, where)] for k, v in value.items()]
        return {_TAG: "dict", "items": pairs}
    raise ValueError(
        f"{where}: value of type {type(value).__name__} cannot be saved by DataProto.save_to_disk, which only "
        "stores None/bool/int/float/str/list/tuple/dict/numpy/tensor values (no pickle, so loading is safe); "
        "convert it to one of those types first"
    )


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value`."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: decode_value(v) for k, v in value.items()}
    if tag == "np_scalar":
        return np.dtype(value["dtype"]).type(value["value"])
    if tag == "np_object":
        return to_object_array([decode_value(v) for v in value["items"]]).reshape(value["shape"])
    if tag == "np":
        return np.asarray(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if tag == "tensor":
        return torch.tensor(value["data"], dtype=getattr(torch, value["dtype"])).reshape(value["shape"])
    if tag == "tuple":
        return tuple(decode_value(v) for v in value["items"])
    if tag == "dict":
        return {_hashable(decode_value(k)): decode_value(v) for k, v in value["items"]}
    raise ValueError(f"unknown tag {tag!r} in a DataProto file; was it written by a newer hybrid_rl?")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def dumps_json(obj: Any) -> str:
    # allow_nan keeps float('nan') metrics round-tripping (Python's json reads NaN back).
    return json.dumps(obj, allow_nan=True)


def loads_json(text: str) -> Any:
    return json.loads(text)


# ---------------------------------------------------------------------------------------------
# one-file safetensors container
# ---------------------------------------------------------------------------------------------

_FORMAT = "hybrid_rl.DataProto/1"


def save_parts(path: str, tensors: dict[str, torch.Tensor] | None, non_tensor_batch: dict[str, np.ndarray],
               meta_info: dict[str, Any]) -> None:
    """Write tensors (``None`` = no tensor batch) plus JSON-encoded non-tensors/meta_info to ``path``."""
    from safetensors.torch import save_file

    header = {
        "format": _FORMAT,
        "has_batch": tensors is not None,
        "batch_size": len(next(iter(tensors.values()))) if tensors else None,
        "non_tensor_batch": {k: encode_value(v, f"non_tensor_batch[{k!r}]") for k, v in non_tensor_batch.items()},
        "meta_info": encode_value(meta_info, "meta_info"),
    }
    # clone: safetensors refuses views that share storage with other tensors (e.g. slices of one batch).
    to_save = {k: v.detach().cpu().contiguous().clone() for k, v in (tensors or {}).items()}
    save_file(to_save, path, metadata={"hybrid_rl": dumps_json(header)})


def load_parts(path: str) -> tuple[dict[str, torch.Tensor] | None, int | None, dict[str, np.ndarray], dict]:
    """Inverse of :func:`save_parts`: ``(tensors or None, batch_size, non_tensor_batch, meta_info)``."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        if "hybrid_rl" not in metadata:
            raise ValueError(f"{path} is not a DataProto file written by DataProto.save_to_disk")
        header = loads_json(metadata["hybrid_rl"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if header.get("format") != _FORMAT:
        raise ValueError(f"{path}: unsupported DataProto file format {header.get('format')!r}, expected {_FORMAT!r}")
    non_tensor = {k: decode_value(v) for k, v in header["non_tensor_batch"].items()}
    return (tensors if header["has_batch"] else None), header["batch_size"], non_tensor, decode_value(header["meta_info"])
