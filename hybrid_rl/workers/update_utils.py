"""Pieces of the learner's update loop: mini-batches and the optimizer step."""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.batching import check_whole_pairs
from hybrid_rl.workers.fsdp_utils import clip_grad_norm

logger = logging.getLogger(__name__)


def check_mini_batch_rows(num_rows: int, mini_batch_rows: int, role: str) -> None:
    """Every rank must take the same number of optimizer steps, so rows must split evenly."""
    if num_rows < mini_batch_rows or num_rows % mini_batch_rows:
        raise ValueError(
            f"{role} update got {num_rows} rows on this rank but a mini-batch is {mini_batch_rows} rows "
            f"({role}.ppo_mini_batch_size x rollout.n / dp_size); the rows must be a positive multiple "
            f"of it. Fix: make data.train_batch_size a multiple of {role}.ppo_mini_batch_size.")


def mini_batches(data: DataProto, mini_batch_rows: int, shuffle: bool, epoch: int,
                 paired: bool = False) -> list[DataProto]:
    """Consecutive mini-batches; with ``shuffle`` the rows are permuted first, seeded by
    ``meta_info["global_steps"]`` and the epoch so a resumed run repeats the same order.

    ``paired``: rows ``2i`` and ``2i + 1`` are a (chosen, rejected) pair that stays together and in
    that order: whole pairs are permuted, and ``mini_batch_rows`` must be even."""
    if paired:
        check_whole_pairs(mini_batch_rows, "a mini-batch")
        check_whole_pairs(len(data), "the batch")
    if shuffle:
        seed = int(data.meta_info.get("global_steps", 0)) * 1000 + epoch
        generator = torch.Generator().manual_seed(seed)
        if paired:  # permute pairs; each keeps its chosen row first
            pairs = torch.randperm(len(data) // 2, generator=generator)
            data = data.select_idxs(torch.stack([2 * pairs, 2 * pairs + 1], dim=1).reshape(-1))
        else:
            data = data.select_idxs(torch.randperm(len(data), generator=generator))
    return data.split(mini_batch_rows)


def extend_metrics(metrics: dict[str, list[float]], values: dict[str, list]) -> None:
    """Append ``values`` (per-micro-batch numbers: floats or 0-dim tensors on the compute device)
    to ``metrics`` as floats, with one device-to-host copy for all the tensors (a ``.item()`` per
    micro-batch would stall a GPU each time)."""
    pending = [(name, i) for name, vals in values.items() for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
    host = torch.stack([values[n][i].float() for n, i in pending]).tolist() if pending else []
    resolved = {key: value for key, value in zip(pending, host)}
    for name, vals in values.items():
        metrics.setdefault(name, []).extend(resolved.get((name, i), v) for i, v in enumerate(vals))


def optimizer_step(module: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: Optional[float],
                   role: str) -> tuple[float, bool]:
    """Clip and step; skip the step when the global gradient norm is not finite.

    Returns ``(grad_norm, skipped)``. The norm is reduced over all ranks, so every rank takes the
    same decision. Gradients are cleared either way.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    grad_norm = clip_grad_norm(params, grad_clip)
    skipped = not bool(torch.isfinite(grad_norm))
    if skipped:
        logger.warning("%s: non-finite grad norm %s, optimizer step skipped", role, grad_norm.item())
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm), skipped
