"""Prompt data: veRL-schema datasets, the padding collate, a resumable loader, the arithmetic task."""

from hybrid_rl.data.arithmetic import ensure_arithmetic_data, generate_arithmetic
from hybrid_rl.data.dataloader import ResumableBatchSampler, ResumableDataLoader, build_dataloader
from hybrid_rl.data.dataset import TRUNCATION_MODES, RLHFDataset, collate_fn, truncate_ids
from hybrid_rl.data.rows import read_rows, validate_row

__all__ = [
    "RLHFDataset",
    "collate_fn",
    "truncate_ids",
    "TRUNCATION_MODES",
    "build_dataloader",
    "ResumableBatchSampler",
    "ResumableDataLoader",
    "generate_arithmetic",
    "ensure_arithmetic_data",
    "read_rows",
    "validate_row",
]
