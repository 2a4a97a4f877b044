"""What the studio's page says about a field beyond its type: a human label derived from the key, and
for the keys that name files, folders or models, whether what the text names exists.

Both are derived from the key's last part, never from a list of keys: ``train_batch_size`` reads
"Train batch size", ``ppo_mini_batch_size`` "PPO mini batch size"; a last part ending in ``path``,
``_files`` or ``_dir`` names something on disk (a model when it is the ``path`` of a ``model``
section, a ``tokenizer_path`` / ``model_path``, or a ``tokenizer`` / ``input_tokenizer``).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from hybrid_rl.studio.workspace import Workspace

__all__ = ["PATH_ROLES", "describe_path", "human_label", "path_role"]

_WORDS = {
    "lr": "learning rate", "num": "number of", "val": "validation", "ckpt": "checkpoint", "ckpts": "checkpoints",
    "cfg": "config", "dir": "folder", "eos": "EOS", "kl": "KL", "ppo": "PPO", "gae": "GAE", "rm": "RM",
    "fsdp": "FSDP", "gpu": "GPU", "gpus": "GPUs", "lora": "LoRA", "ref": "reference", "mfu": "MFU", "adv": "advantage",
    "dtype": "dtype", "bsz": "batch size", "ray": "Ray", "vllm": "vLLM", "hf": "HF", "sql": "SQL", "ema": "EMA",
    "topk": "top-k", "top": "top", "std": "std", "dapo": "DAPO", "grpo": "GRPO", "rloo": "RLOO", "cpu": "CPU",
    "id": "ID", "ids": "IDs", "lam": "lambda", "ctrl": "control", "gdpo": "GDPO", "rl": "RL", "sft": "SFT", "max": "max", "min": "min", "coef": "coefficient", "cov": "covariance", "ub": "upper bound", "lb": "lower bound", "json": "JSON", "yaml": "YAML", "url": "URL", "tis": "TIS", "is": "IS",
}

PATH_ROLES = ("model", "file", "folder", "output")
"""``model``: a model (or tokenizer) folder or the embedded model's id; ``file``: an input file, glob or list of them
(or a URL); ``folder``: an input folder; ``output``: a folder or file the run writes (created when
missing: the run folder, the data cache, the experience buffer's database)."""


_GENERIC = {"path", "name", "type", "enable", "enabled", "mode", "strategy", "preset", "key", "source", "module"}
"""Last parts that say little alone: the section's name goes in front (``model.path`` -> "Model path")."""


def _words(part: str) -> str:
    if part == "n":  # rollout.n, val_kwargs.n
        return "samples per prompt (n)"
    return " ".join(_WORDS.get(w, w) for w in part.split("_") if w)


def human_label(key: str) -> str:
    """``actor_rollout_ref.actor.optim.lr`` -> ``Learning rate``; acronyms stay upper-case; a generic
    last part gets its section's name (``actor_rollout_ref.model.path`` -> ``Model path``)."""
    parts = key.split(".")
    text = _words(parts[-1])
    if parts[-1] in _GENERIC and len(parts) > 1:
        text = f"{_words(parts[-2])} {text}"
    text = text or key
    return text[0].upper() + text[1:]


def path_role(key: str) -> Optional[str]:
    """One of :data:`PATH_ROLES` for a key naming something on disk, else None."""
    parts = key.split(".")
    last = parts[-1]
    if last in ("tokenizer_path", "model_path", "tokenizer", "input_tokenizer") or (
            last == "path" and len(parts) > 1 and parts[-2] == "model"):
        return "model"
    if last.endswith("_dir"):
        return "output" if last in ("default_local_dir", "cache_dir") else "folder"
    if len(parts) > 1 and parts[-2] == "buffer" and last == "path":  # the experience buffer's file (or URL)
        return "output"
    if last == "resume_from_path":
        return "folder"
    if last == "path" or last.endswith(("_path", "_files")):
        return "file"
    return None


def _one_path(role: str, text: str, workspace: Optional["Workspace"]) -> tuple[str, str]:
    """``(state, message)`` of one path: ``ok``, ``missing``, ``note`` (not checked here) or
    ``refused`` (outside the ``workspace``: never looked at)."""
    if "${" in text:
        return "note", f"follows {text}"
    if "://" in text:
        return "note", "a URL (not checked here)"
    if workspace is not None:
        refusal = workspace.refusal(text)
        if refusal is not None:
            return "refused", refusal
    local = str(workspace.resolve(text)) if workspace is not None else os.path.expanduser(text)
    if role == "model":
        from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID

        if os.path.isdir(local):
            if os.path.isfile(os.path.join(local, "config.json")):
                return "ok", "a model folder"
            if any(os.path.isfile(os.path.join(local, name)) for name in ("tokenizer_config.json", "tokenizer.json")):
                return "ok", "a tokenizer folder"
            return "missing", "a folder without config.json"
        if text == EMBEDDED_MODEL_ID:
            return "ok", "the embedded model (no download)"
        return "missing", "no such folder, and not the embedded model's id"
    if role == "output":
        return ("ok", "exists") if os.path.exists(local) else ("note", "does not exist yet: the run creates it")
    if os.path.exists(local):
        return "ok", "a folder" if os.path.isdir(local) else "a file"
    if glob.has_magic(text) and _matches(text, workspace):
        return "ok", "the pattern matches"
    return "missing", "does not exist"


def _matches(pattern: str, workspace: Optional["Workspace"]) -> bool:
    """Whether a glob matches something (inside the workspace when one is given); stops at the first."""
    if workspace is not None:
        return workspace.glob_inside(pattern)
    return next(glob.iglob(os.path.expanduser(pattern)), None) is not None


def describe_path(role: str, value: Any, workspace: Optional["Workspace"] = None) -> Optional[dict[str, str]]:
    """``{"state": "ok" | "missing" | "note" | "refused", "message": ...}`` for a path field's value (a
    string or a list of them); None when the value is unset. With a ``workspace``, a path outside it
    is ``refused`` and never looked at (:class:`hybrid_rl.studio.workspace.Workspace`)."""
    if value is None or value == "" or value == []:
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    results = [_one_path(role, str(item), workspace) for item in items]
    for state in ("refused", "missing"):
        bad = [(str(item), message) for item, (s, message) in zip(items, results) if s == state]
        if bad:
            item, message = bad[0]
            where = f"{item}: " if len(items) > 1 and state == "missing" else ""
            count = f" ({len(bad)} of {len(items)})" if len(items) > 1 else ""
            return {"state": state, "message": where + message + count}
    if all(s == "ok" for s, _ in results):
        return {"state": "ok", "message": results[0][1] if len(results) == 1 else f"all {len(items)} exist"}
    return {"state": "note", "message": next(m for s, m in results if s == "note")}
