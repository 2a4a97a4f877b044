"""Turn a worker checkpoint (``global_step_N/actor`` or ``critic``) into a plain Hugging Face folder.

    python -m hybrid_rl.model_merger --local_dir checkpoints/p/e/global_step_20/actor --target_dir out/
    python -m hybrid_rl.model_merger merge --backend fsdp --local_dir ... --target_dir ...   # veRL form

The checkpoint format is :mod:`hybrid_rl.workers.checkpoint`: ``checkpoint_meta.json`` plus either
one unsharded ``model.safetensors`` or one ``model_world_W_rank_r.safetensors`` per rank holding
that rank's FSDP2 shards (dim-0 pieces, ``torch.chunk`` layout, in rank order), and a
``huggingface/`` folder with the config and tokenizer. Shards are re-assembled by concatenation
along dim 0; the expected full shape of every tensor comes from the model built from the config on
the meta device, so a replicated tensor is recognised and any mismatch is an error, not a silent
corruption. The result loads with ``AutoModelForCausalLM.from_pretrained(target_dir)`` (or
``AutoModelForTokenClassification`` for a critic, ``AutoModelForSequenceClassification`` for a
reward model trained by ``main_rm``).

A LoRA actor's checkpoint (``huggingface/adapter_config.json`` present) gives both exports: the
merged model in ``target_dir`` (peft's ``merge_and_unload``) and the adapter alone in
``target_dir/lora_adapter`` (peft's ``save_pretrained``: ``PeftModel.from_pretrained(base, that
folder)`` loads it on the base model), as veRL's merger lays them out.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path
from typing import Optional, Sequence

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

META_FILE = "checkpoint_meta.json"
HF_SUBDIR = "huggingface"
ADAPTER_CONFIG = "adapter_config.json"
LORA_SUBDIR = "lora_adapter"
# Wrappers that may prefix parameter names (activation checkpointing, torch.compile).
_NAME_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _read_meta(local_dir: Path) -> dict:
    path = local_dir / META_FILE
    if not path.is_file():
        raise ValueError(
            f"--local_dir {local_dir} is not a complete worker checkpoint (no {META_FILE}). Point it at "
            "<default_local_dir>/global_step_N/actor (or .../critic) of a finished save."
        )
    return json.loads(path.read_text())


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(f"checkpoint file {path} is missing: the checkpoint is incomplete")
    with safe_open(str(path), framework="pt") as fh:
        return {_clean(k): fh.get_tensor(k) for k in fh.keys()}


def _clean(name: str) -> str:
    for prefix in _NAME_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _build_meta_model(hf_dir: Path, kind: str, lora: bool = False):
    """The model class for ``kind`` instantiated on the meta device (shapes only, no memory); with
    ``lora`` wrapped with the checkpoint's LoRA adapters (peft names)."""
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)

    from hybrid_rl.workers.model_loader import is_sequence_classifier

    config = AutoConfig.from_pretrained(hf_dir)
    auto_cls = AutoModelForCausalLM if kind == "causal_lm" else AutoModelForTokenClassification
    if kind == "value":
        config.num_labels = 1
        if is_sequence_classifier(config):  # a reward model (hybrid_rl.workers.rm_worker)
            auto_cls = AutoModelForSequenceClassification
    with torch.device("meta"):
        model = auto_cls.from_config(config)
        if lora:
            model = _with_adapters(model, hf_dir)
    return model, auto_cls, config


def _with_adapters(model, hf_dir: Path):
    """``model`` wrapped with LoRA adapters as described by the checkpoint's adapter config."""
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig.from_pretrained(str(hf_dir))
    model.name_or_path = lora_config.base_model_name_or_path  # keep the trained base's path in the export
    return get_peft_model(model, lora_config)


def merge_shards(shards: list[dict[str, torch.Tensor]], expected: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Full tensors from per-rank dim-0 shards (rank order); replicated tensors are taken once.

    Args:
        shards: one ``{name: local tensor}`` per rank.
        expected: full shape of every tensor the model needs.
    """
    merged = {}
    for name, shape in expected.items():
        pieces = [s[name] for s in shards if name in s]
        if not pieces:
            raise ValueError(f"tensor {name!r} is in no shard of the checkpoint: it was written for another model")
        if all(p.shape == shape for p in pieces):
            full = pieces[0]  # replicated on every rank (or a 1-rank checkpoint)
        else:
            full = torch.cat(pieces, dim=0)  # FSDP2 Shard(0): rank r holds chunk r
        if full.shape != shape:
            raise ValueError(f"tensor {name!r}: shards re-assemble to {tuple(full.shape)}, the model expects "
                             f"{tuple(shape)}; the checkpoint does not match the config in {HF_SUBDIR}/")
        merged[name] = full
    return merged


def _detect_kind(names: Sequence[str]) -> str:
    if any(n == "lm_head.weight" or n.endswith(".lm_head.weight") for n in names):
        return "causal_lm"
    if any(n.startswith("score.") for n in names):
        return "value"
    return "causal_lm"  # tied-embedding LMs may store no lm_head


def load_full_state(local_dir: Path, meta: dict) -> dict[str, torch.Tensor]:
    """Every rank's model tensors (one dict per rank; one dict for a full checkpoint)."""
    if "model" not in meta.get("contents", ["model"]):
        hf_weights = local_dir / HF_SUBDIR / "model.safetensors"
        if hf_weights.is_file():
            return _load_file(hf_weights)
        raise ValueError(f"checkpoint {local_dir} was saved without model weights (contents={meta['contents']})")
    if meta.get("model_saved_as") == "full":
        return _load_file(local_dir / "model.safetensors")
    world = int(meta["world_size"])
    shards = [_load_file(local_dir / f"model_world_{world}_rank_{r}.safetensors") for r in range(world)]
    return {"__shards__": shards}  # resolved against the model's shapes by merge_checkpoint


def merge_checkpoint(local_dir: str, target_dir: str, dtype: Optional[str] = None) -> str:
    """Write an HF folder for the worker checkpoint at ``local_dir`` into ``target_dir``; returns it."""
    local, target = Path(local_dir).expanduser(), Path(target_dir).expanduser()
    meta = _read_meta(local)
    hf_dir = local / HF_SUBDIR
    if not (hf_dir / "config.json").is_file():
        raise ValueError(f"{hf_dir} has no config.json; the checkpoint lacks the model config needed to rebuild it")
    state = load_full_state(local, meta)
    names = state["__shards__"][0].keys() if "__shards__" in state else state.keys()
    lora = (hf_dir / ADAPTER_CONFIG).is_file() and "model" in meta.get("contents", ["model"])
    kind = "causal_lm" if lora else _detect_kind(list(names))
    model, auto_cls, config = _build_meta_model(hf_dir, kind, lora)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if "__shards__" in state:
        state = merge_shards(state["__shards__"], expected)
    model = _loaded(state, auto_cls, config, hf_dir if lora else None)
    if lora:
        model.save_pretrained(target / LORA_SUBDIR)  # the adapter alone (PEFT folder)
        model = model.merge_and_unload()
    _write_hf(model, hf_dir, target, dtype)
    logger.info("merged %s (%s%s, step %s) into %s", local, kind, ", LoRA" if lora else "", meta.get("global_step"),
                target)
    return str(target)


def _loaded(state: dict[str, torch.Tensor], auto_cls, config, adapter_dir: Optional[Path]):
    """A real model (adapters included when ``adapter_dir`` is given) holding ``state``. A LoRA model
    is built in fp32 (its base may be stored in bf16), so the merge is exact before ``--dtype``."""
    model = auto_cls.from_config(config, dtype=torch.float32) if adapter_dir is not None else auto_cls.from_config(config)
    if adapter_dir is not None:
        model = _with_adapters(model, adapter_dir)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied output embeddings are legitimately absent from some state dicts.
    missing = [m for m in missing if not (m.endswith("lm_head.weight") and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def _write_hf(model, hf_dir: Path, target: Path, dtype: Optional[str]) -> None:
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
        model.config.torch_dtype = dtype
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    for entry in hf_dir.iterdir():  # tokenizer files and generation config
        skip = ("config.json", "model.safetensors", ADAPTER_CONFIG)
        if entry.is_file() and entry.name not in skip and not (target / entry.name).exists():
            shutil.copy2(entry, target / entry.name)


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Merge a hybrid_rl worker checkpoint into a Hugging Face folder.")
    parser.add_argument("operation", nargs="?", default="merge", choices=["merge"], help="veRL compatibility")
    parser.add_argument("--backend", default="fsdp", choices=["fsdp"], help="checkpoint backend (veRL compatibility)")
    parser.add_argument("--local_dir", required=True, help=".../global_step_N/actor (or critic)")
    parser.add_argument("--target_dir", required=True, help="output HF folder")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="cast the weights (default: keep the checkpoint's dtype)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return merge_checkpoint(args.local_dir, args.target_dir, dtype=args.dtype)
    except ValueError as error:
        raise SystemExit(f"hybrid_rl.model_merger: {error}") from None


if __name__ == "__main__":
    main()
