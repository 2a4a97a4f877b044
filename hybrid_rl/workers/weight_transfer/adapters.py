"""Adapters-only pushes of a LoRA actor (as veRL's non-merged LoRA sync, ``model.lora.merge=False``).

The actor's first push writes the base weights once (every tensor but the adapter factors, under the
HF names) and pins them in the exporter; every push, the first included, writes the LoRA A/B factors
alone (``2 * r * (in + out)`` values per adapted layer) with a :class:`LoraAdapter` naming the pinned
base. The receiver maps both and hands the engine ``W + scaling * B @ A`` for every adapted layer,
computed as the trainer's own merge (:func:`hybrid_rl.workers.lora.merged_lora_weights`: fp32, then
the rollout dtype), so an adapters-only push loads the same weights as a merged push, bit for bit.
Because every load reads the pinned base, an engine that lost its weights (a restart, a sleep) is
whole again after any push; a trainer restart pins a new base with its first push.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator, Optional

import torch

from hybrid_rl.workers.weight_transfer.export import DEFAULT_BUCKET_BYTES, WeightExporter
from hybrid_rl.workers.weight_transfer.handle import LoraAdapter, WeightHandle

__all__ = ["ADAPTER_PREFIX", "adapter_names", "apply_adapters", "export_lora"]

ADAPTER_PREFIX = "base_model.model."
"""peft's prefix of saved-adapter keys (``get_peft_model_state_dict``; vLLM reads the same keys)."""


def adapter_names(weight_name: str) -> tuple[str, str]:
    """peft's saved-adapter names of the A and B factors of the layer whose HF weight is ``weight_name``."""
    layer = ADAPTER_PREFIX + weight_name.removesuffix(".weight")
    return f"{layer}.lora_A.weight", f"{layer}.lora_B.weight"


def apply_adapters(base: Iterable[tuple[str, torch.Tensor]], adapters: dict[str, torch.Tensor],
                   lora: LoraAdapter) -> Iterator[tuple[str, torch.Tensor]]:
    """The base stream with every adapted weight replaced by ``W + scaling * B @ A`` (in fp32, cast to
    ``lora.dtype``); the other tensors pass through as they are (already in the rollout dtype)."""
    scalings = dict(lora.scalings)
    dtype = getattr(torch, lora.dtype)
    missing = [n for w in scalings for n in adapter_names(w) if n not in adapters]
    if missing:
        raise ValueError(f"weight transfer: the adapters-only push lacks {len(missing)} LoRA factors, e.g. "
                         f"{missing[0]!r}. Fix: export the push with export_rollout_weights of the same actor.")
    with torch.no_grad():
        for name, tensor in base:
            scaling = scalings.get(name)
            if scaling is None:
                yield name, tensor
                continue
            a_name, b_name = adapter_names(name)
            a, b = adapters[a_name], adapters[b_name]  # [r, in], [out, r]
            # merged_lora_weights' base.float() + scaling * (B @ A), in place: the same fp32 roundings
            # (a sum commutes exactly), two [out, in] temporaries fewer.
            merged = (b.float() @ a.float()).mul_(scaling).add_(tensor)  # [out, in] fp32
            yield name, merged.to(dtype)


def export_lora(exporter: WeightExporter, adapters: Iterable[tuple[str, torch.Tensor]],
                base: Optional[Iterable[tuple[str, torch.Tensor]]], base_aliases: dict[str, str],
                config: dict[str, Any], transport: str = "shm",
                bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightHandle:
    """One adapters-only push. ``base``: the base stream for the first push (written and pinned), or
    None to reuse the base the exporter pinned before (it must travel by ``transport`` too).
    ``config``: ``r``, ``lora_alpha``, ``target_modules``, ``scalings``, ``dtype`` of :class:`LoraAdapter`."""
    carries_base = base is not None
    if carries_base:
        exporter.pin(exporter.export(base, base_aliases, transport, bucket_bytes))
    pinned = exporter.pinned
    if pinned is None or pinned.transport != transport:
        raise ValueError(f"weight transfer: no base weights pinned for transport {transport!r}. Fix: pass the "
                         "base stream with the first adapters-only push (and again when the transport changes).")
    handle = exporter.export(adapters, {}, transport, bucket_bytes)
    lora = LoraAdapter(r=int(config["r"]), lora_alpha=float(config["lora_alpha"]),
                       target_modules=tuple(config["target_modules"]), scalings=tuple(config["scalings"]),
                       dtype=str(config["dtype"]), base=pinned, carries_base=carries_base)
    return dataclasses.replace(handle, lora=lora)
