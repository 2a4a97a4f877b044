"""Weight transfer from the trainer to a separate rollout pool (the decoupled mode) without pickling.

The exporting rank writes each gathered tensor once into flat byte buckets: shared-memory files
under ``/dev/shm`` when every rollout worker is on its node, Ray object-store ``uint8`` numpy arrays
otherwise (Ray stores numpy out of band: no pickled tensors). Only a small
:class:`~hybrid_rl.workers.weight_transfer.handle.WeightHandle` of plain Python data crosses Ray; the
receiver maps the buckets and hands zero-copy views to the engine's ``update_weights``. A LoRA actor
pushes its base weights once and then the adapters alone (:mod:`.adapters`). The colocated mode does
not use this package: it streams weights in-process.
"""

from hybrid_rl.workers.weight_transfer.adapters import apply_adapters, export_lora
from hybrid_rl.workers.weight_transfer.export import (DEFAULT_BUCKET_BYTES, WeightExporter, alias_groups,
                                                   rollout_aliases)
from hybrid_rl.workers.weight_transfer.handle import LoraAdapter, TensorEntry, WeightHandle
from hybrid_rl.workers.weight_transfer.load import open_weights
from hybrid_rl.workers.weight_transfer.pushes import PushLedger, choose_transport
from hybrid_rl.workers.weight_transfer.shm import SEGMENT_PREFIX, sweep_dead_segments

__all__ = ["DEFAULT_BUCKET_BYTES", "LoraAdapter", "PushLedger", "SEGMENT_PREFIX", "TensorEntry", "WeightExporter",
           "WeightHandle", "alias_groups", "apply_adapters", "choose_transport", "export_lora", "open_weights",
           "rollout_aliases", "sweep_dead_segments"]
