"""Whether a local HF folder's weights can be loaded, read from the files' headers alone.

The driver calls :func:`weights_problem` before any worker starts (for a distillation teacher, whose
folder is otherwise first read when the worker builds it). It reads no tensor data: safetensors headers
(which also catch a truncated download), a ``.bin`` file's zip directory, a sharded index's file list, and
the parameter names and shapes of the folder's ``config.json`` built on the meta device. Models whose
checkpoints transformers renames or fuses while loading (MoE experts, ...) get the file checks only.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Optional

__all__ = ["needs_remote_code", "weights_problem"]

SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def needs_remote_code(folder: str) -> bool:
    """Whether the model folder ``folder`` names code of its own (an ``auto_map`` in its ``config.json`` or
    ``tokenizer_config.json``). A start-up check never imports it: the run does, in its workers."""
    for name in ("config.json", "tokenizer_config.json"):
        try:
            data = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # missing or unreadable: the folder checks report that
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            return True
    return False


def _weight_files(folder: Path) -> list[Path]:
    """The folder's weight files: the single file, or every shard its index names."""
    for name in SINGLE_FILES:
        if (folder / name).is_file():
            return [folder / name]
    for name in INDEX_FILES:
        index = folder / name
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            return [folder / shard for shard in sorted(set(weight_map.values()))]
    return []


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from one weight file's header (``{}`` for a ``.bin``, whose shapes need a
    full read); raises on a missing, truncated or foreign file."""
    if not path.is_file():
        raise OSError(f"{path.name} is missing")
    if path.suffix == ".bin":
        with zipfile.ZipFile(path):  # a truncated file has no central directory
            return {}
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def _expected_shapes(folder: Path, trust_remote_code: bool) -> Optional[tuple[dict[str, tuple[int, ...]], str]]:
    """Parameter name -> shape of the model ``config.json`` describes (tied weights once), and its base
    model prefix; None for a model type whose checkpoints transformers converts while loading."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if needs_remote_code(str(folder)):  # a check never imports a model folder's own code; the run does
        return None
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        if get_checkpoint_conversion_mapping(config.model_type):
            return None
    except ImportError:  # older transformers: no conversions at load
        pass
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}, f"{model.base_model_prefix}."


def _key_problems(expected: dict[str, tuple[int, ...]], prefix: str, found: dict[str, tuple[int, ...]]) -> list[str]:
    """Missing tensors and shape mismatches, matching names with or without the base model ``prefix``."""
    missing, mismatched = [], []
    for name, shape in expected.items():
        got = found.get(name, found.get(name.removeprefix(prefix)))
        if got is None:
            missing.append(name)
        elif got != shape:
            mismatched.append(f"{name} {list(got)} != {list(shape)}")
    problems = []
    if mismatched:
        problems.append(f"{len(mismatched)} tensors have other shapes than config.json says (first: {mismatched[0]})")
    if missing:
        problems.append(f"{len(missing)} of {len(expected)} tensors are missing (first: {missing[0]})")
    return problems


def weights_problem(path: str, key: str, trust_remote_code: bool = False) -> Optional[str]:
    """One line saying why the weights in the HF folder ``path`` cannot be loaded; None when they can."""
    folder = Path(path).expanduser()
    files = _weight_files(folder)
    if not files:
        return (f"{key}={path!r} has no weights ({' or '.join(SINGLE_FILES + INDEX_FILES)}); export the model with "
                "save_pretrained or python -m hybrid_rl.model_merger.")
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            found.update(_file_shapes(file))
        except Exception as error:  # safetensors raises its own error type
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            return (f"{key}={path!r}: {file.name} cannot be read ({reason}); the file is truncated or not a "
                    "weight file: download or export the model again.")
    if not found or any(f.suffix == ".bin" for f in files):
        return None
    expected = _expected_shapes(folder, trust_remote_code)
    problems = _key_problems(*expected, found) if expected else []
    if problems:
        return (f"{key}={path!r}: its weights do not fit its config.json ({'; '.join(problems)}); point it at "
                "the folder the weights were saved with.")
    return None
