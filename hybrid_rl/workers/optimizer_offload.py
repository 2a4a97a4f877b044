"""GPU optimizer offload shared by the workers: the state lives on CPU except inside ``with offload:``."""

from __future__ import annotations

from typing import Any

import torch

from hybrid_rl.workers.fsdp_utils import move_optimizer_state

__all__ = ["OptimizerOffload"]


class OptimizerOffload:
    """GPU optimizer offload: the state lives on CPU except inside ``with offload:`` (updates,
    checkpoint loads). A no-op on CPU or when disabled."""

    def __init__(self, optimizer: torch.optim.Optimizer, enabled: bool, device: torch.device):
        self.optimizer, self.device = optimizer, device
        self.enabled = enabled and device.type == "cuda"

    def offload(self) -> None:
        if self.enabled:
            move_optimizer_state(self.optimizer, "cpu")

    def __enter__(self) -> None:
        if self.enabled:
            move_optimizer_state(self.optimizer, self.device)

    def __exit__(self, *exc: Any) -> None:
        self.offload()
