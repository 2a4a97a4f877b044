"""The replay files of ``trainer.dump_replay_batch``: each step's whole batch, and the run's ``meta.json``.

The sidecar keeps each row's real response tokens; replay (:mod:`hybrid_rl.trainer.ppo.replay`)
needs the padded batch the update consumed. ``{global_step}.batch.pt`` holds it, every row (never cut
by ``trainer.dump_max_rows_per_step``), as written after the step's update::

    {"tensors": {key: tensor [B, ...]}, "columns": "<JSON: non-tensor columns and meta_info>",
     "format": 1}

It is read with ``torch.load(weights_only=True)``: tensors, strings and numbers only, nothing is
unpickled. The non-tensor columns (numpy object arrays of strings, dicts, numbers) are JSON, each
with its numpy dtype so it comes back as it was. ``meta.json`` records what the batches were made
with: the resolved config (secrets redacted), the device, and the code's version and git commit, so
a replay with another config or other code is refused in one line. Both are created 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Any, Optional

import numpy as np
import torch

from hybrid_rl.protocol import DataProto

__all__ = ["BATCH_FORMAT", "META_FILE", "POINTER_FILE", "batch_path", "code_identity", "config_digest", "load_batch",
           "plain_json", "read_meta", "read_pointer", "save_batch", "write_meta", "write_pointer"]

BATCH_FORMAT = 1
"""Version of the ``{step}.batch.pt`` layout."""
META_FILE = "meta.json"
"""Beside the dumps: the config, device and code the batches were made with."""
POINTER_FILE = "replay.json"
"""In the run folder: ``{"rollout_data_dir": <absolute dump folder>}``, so ``replay RUN_DIR`` finds the dumps."""


def batch_path(folder: str, step: int) -> str:
    """``{folder}/{step}.batch.pt``."""
    return os.path.join(folder, f"{step}.batch.pt")


def plain_json(value: Any) -> Any:
    """``json``'s ``default``: numpy and torch scalars and arrays as numbers and lists; anything else as ``str``."""
    if isinstance(value, (np.generic, torch.Tensor)) and np.ndim(value) == 0:
        return value.item()
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    return str(value)


def _private(path: str) -> Any:
    """A binary file object for ``path``, created (or truncated) with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
    return os.fdopen(fd, "wb")


def save_batch(path: str, batch: DataProto) -> None:
    """Write ``batch`` (tensors, non-tensor columns, meta_info) to ``path``, 0600."""
    items = batch.batch.items() if batch.batch is not None else ()
    tensors = {key: value.detach().cpu().contiguous() for key, value in items}
    columns = {key: {"dtype": column.dtype.str if column.dtype != object else "object", "values": column.tolist()}
               for key, column in batch.non_tensor_batch.items()}
    text = json.dumps({"non_tensor_batch": columns, "meta_info": batch.meta_info}, default=plain_json)
    with _private(path) as f:
        torch.save({"format": BATCH_FORMAT, "tensors": tensors, "columns": text}, f)


def load_batch(path: str) -> DataProto:
    """The batch :func:`save_batch` wrote (``torch.load(weights_only=True)``: no pickled objects)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != BATCH_FORMAT:
        raise ValueError(f"{path} is not a replay batch of format {BATCH_FORMAT} (written by another version of "
                         "hybrid_rl?). Fix: replay with the version that wrote it, or rerun the step.")
    plain = json.loads(saved["columns"])
    columns = {}
    for key, column in plain["non_tensor_batch"].items():
        if column["dtype"] == "object":
            values = np.empty(len(column["values"]), dtype=object)
            for i, value in enumerate(column["values"]):  # one by one: a row's list stays one element
                values[i] = value
        else:
            values = np.asarray(column["values"], dtype=np.dtype(column["dtype"]))
        columns[key] = values
    return DataProto.from_dict(tensors=saved["tensors"] or None, non_tensors=columns, meta_info=plain["meta_info"])


# ---------------------------------------------------------------------- meta.json
def code_identity() -> dict[str, Optional[str]]:
    """``{"version", "commit"}`` of the running hybrid_rl: its ``__version__`` and the git commit of the
    checkout it is imported from (None outside a git checkout, e.g. an installed wheel)."""
    import hybrid_rl

    package = os.path.dirname(os.path.abspath(hybrid_rl.__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": hybrid_rl.__version__, "commit": commit}


def config_digest(config: dict[str, Any]) -> str:
    """A short stable digest of a plain config dict (sorted JSON)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_meta(folder: str, config: dict[str, Any], device: str) -> str:
    """Write ``meta.json`` into ``folder``, 0600: ``config`` (resolved; redacted here), ``device``, the
    code's version and commit. Returns its path."""
    from hybrid_rl.utils.redact import redact_config

    redacted = redact_config(config)
    meta = {"config": redacted, "config_digest": config_digest(redacted), "device": device, **code_identity()}
    path = os.path.join(folder, META_FILE)
    with _private(path) as f:
        f.write(json.dumps(meta, indent=1, default=str).encode("utf-8"))
    return path


def read_meta(folder: str) -> Optional[dict[str, Any]]:
    """The ``meta.json`` of ``folder``, or None when there is none."""
    path = os.path.join(folder, META_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_pointer(run_dir: str, folder: str) -> str:
    """Write ``{run_dir}/replay.json`` naming the dump folder (absolute), 0600. Returns its path."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, POINTER_FILE)
    with _private(path) as f:
        f.write(json.dumps({"rollout_data_dir": os.path.abspath(folder)}).encode("utf-8"))
    return path


def read_pointer(run_dir: str) -> Optional[str]:
    """The dump folder ``{run_dir}/replay.json`` names, or None when the run wrote none."""
    path = os.path.join(run_dir, POINTER_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("rollout_data_dir")
