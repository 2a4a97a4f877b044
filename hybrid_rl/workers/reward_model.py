"""A scalar reward model on one data-parallel rank: scores and Bradley-Terry updates (no Ray inside).

The model is the critic's layout (veRL's reward model): a causal-LM backbone with a one-output
token-classification head, read at each sequence's last valid token
(:func:`~hybrid_rl.workers.forward.sequence_scores`). A pair batch has one row per pair
(``chosen_*`` and ``rejected_*`` sequences, ``margin``; :mod:`hybrid_rl.data.reward_data`); a
micro-batch of ``m`` pairs runs as one forward over its ``2m`` sequences. The loss of each
micro-batch is divided by the pairs of the whole batch on all ranks, so micro-batch and
data-parallel splits give the gradient of the batch in one piece.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch
from torch import nn

from hybrid_rl.algorithms.reward_loss import bradley_terry_loss, preference_metrics
from hybrid_rl.data.reward_data import SIDES
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.batching import all_reduce_sum
from hybrid_rl.workers.forward import sequence_scores
from hybrid_rl.workers.fsdp_utils import dp_world
from hybrid_rl.workers.update_utils import optimizer_step

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")


def _concat_rows(parts: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Stack right-padded row sets of different widths into one ``[sum B, max L]`` set."""
    width = max(p["input_ids"].shape[1] for p in parts)

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    return {k: torch.cat([widen(p[k], pad_token_id if k == "input_ids" else 0) for p in parts]) for k in SEQUENCE_KEYS}


class DataParallelRewardModel:
    """Scores and pairwise updates of ``module`` on this rank's rows.

    Args:
        module: HF token-classification model with ``num_labels=1`` (FSDP2 or plain).
        optimizer: optimizer over its parameters (None: scoring only).
        micro_batch_pairs: pairs per forward/backward (sequences per forward when scoring).
        use_remove_padding: pack valid tokens instead of running on padding.
        grad_clip: max global gradient norm (None: no clipping).
        pad_token_id: id used to widen rows when chosen and rejected differ in width.
        device: where micro-batches are moved for compute.
    """

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 micro_batch_pairs: int = 4, use_remove_padding: bool = False, grad_clip: Optional[float] = 1.0,
                 pad_token_id: int = 0, device: torch.device | str = "cpu"):
        if micro_batch_pairs < 1:
            raise ValueError(f"micro_batch_pairs={micro_batch_pairs} must be >= 1")
        self.module = module
        self.optimizer = optimizer
        self.micro_batch_pairs = micro_batch_pairs
        self.use_remove_padding = use_remove_padding
        self.grad_clip = grad_clip
        self.pad_token_id = pad_token_id
        self.device = torch.device(device)
        self.rank, self.dp_size = dp_world()
        self.num_skipped_steps = 0

    def _scores(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = {k: rows[k].to(self.device) for k in SEQUENCE_KEYS}
        return sequence_scores(self.module, rows["input_ids"], rows["attention_mask"], rows["position_ids"],
                               self.use_remove_padding)

    @torch.no_grad()
    def compute_scores(self, data: DataProto, prefix: str = "") -> torch.Tensor:
        """Scores ``[B]`` (float32) of the sequences ``{prefix}input_ids`` etc."""
        self.module.eval()
        out = []
        for micro in data.select(batch_keys=[prefix + k for k in SEQUENCE_KEYS]).split(self.micro_batch_pairs):
            out.append(self._scores({k: micro.batch[prefix + k] for k in SEQUENCE_KEYS}).cpu())
        return torch.cat(out)

    def _pair_scores(self, micro: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen [m], rejected [m])`` scores of ``m`` pairs from one forward over ``2m`` rows."""
        rows = _concat_rows([{k: micro.batch[f"{side}_{k}"] for k in SEQUENCE_KEYS} for side in SIDES],
                            self.pad_token_id)
        scores = self._scores(rows)
        return scores[:len(micro)], scores[len(micro):]

    @torch.no_grad()
    def compute_pair_scores(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen [B], rejected [B])`` scores of a pair batch."""
        self.module.eval()
        parts = [self._pair_scores(micro) for micro in data.split(self.micro_batch_pairs)]
        return torch.cat([c for c, _ in parts]).cpu(), torch.cat([r for _, r in parts]).cpu()

    def update(self, data: DataProto) -> dict[str, list[float]]:
        """One optimizer step on the Bradley-Terry loss of the pair batch ``data`` (``margin`` [B]
        is subtracted from each score difference)."""
        if self.optimizer is None:
            raise ValueError("this reward model was built without an optimizer: it scores only")
        metrics: dict[str, list[float]] = defaultdict(list)
        num_pairs = float(all_reduce_sum(torch.tensor(float(len(data))), self.device))
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = torch.zeros((), dtype=torch.float64)
        chosen_all, rejected_all = [], []
        for micro in data.split(self.micro_batch_pairs):
            chosen, rejected = self._pair_scores(micro)
            loss = bradley_terry_loss(chosen, rejected, micro.batch["margin"].to(chosen.device), num_pairs=num_pairs)
            (loss * self.dp_size).backward()  # FSDP averages over ranks; the loss needs the sum
            loss_total += loss.detach().double().cpu()
            chosen_all.append(chosen.detach().cpu())
            rejected_all.append(rejected.detach().cpu())
        self.module.eval()
        metrics["rm/loss"].append(float(all_reduce_sum(loss_total, self.device)))
        for name, value in preference_metrics(torch.cat(chosen_all), torch.cat(rejected_all)).items():
            metrics[name].append(value)
        grad_norm, skipped = optimizer_step(self.module, self.optimizer, self.grad_clip, "reward_model")
        self.num_skipped_steps += int(skipped)
        metrics["rm/grad_norm"].append(grad_norm)
        return dict(metrics)
