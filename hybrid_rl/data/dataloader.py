"""A resumable DataLoader: its position (epoch, batch within the epoch, seed) saves and restores exactly.

The shuffle order of epoch ``e`` is ``randperm(N)`` under a generator seeded with ``seed + e``, so
it depends only on the saved state, never on global RNG state. The loader counts the batches it
has *handed out* (not the ones the sampler produced), so worker prefetching never advances the
saved position; a run restored from ``state_dict()`` sees exactly the batches the original run
would have seen next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    """Yields index batches of one epoch, starting at batch ``start_batch`` of epoch ``epoch``."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if num_samples < 1:
            raise ValueError("the dataset is empty; a dataloader needs at least one row")
        if drop_last and num_samples < batch_size:
            raise ValueError(
                f"the dataset has {num_samples} rows, fewer than batch_size={batch_size} with drop_last=True, "
                f"so no batch can be formed; lower the batch size or add data"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.start_batch = 0

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        """Row order of ``epoch`` (a seeded permutation, or 0..N-1 without shuffling)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=gen).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self.epoch_order(self.epoch)
        for b in range(self.start_batch, len(self)):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]


class ResumableDataLoader:
    """Iterates one epoch per ``iter()``, resuming mid-epoch from the saved position.

    ``len()`` is the number of batches in a full epoch (as for a torch DataLoader). Stopping an
    iteration early (``break``) keeps the position: the next ``iter()`` continues where it stopped.
    """

    def __init__(self, dataset: Dataset, sampler: ResumableBatchSampler, collate_fn: Callable | None,
                 num_workers: int = 0):
        self.dataset = dataset
        self.sampler = sampler
        # Its own generator: starting an epoch draws a base seed from it, never from the global RNG
        # (a resumed run starts epochs at other points; the decoupled mode iterates in a thread).
        self._loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers,
                                  generator=torch.Generator().manual_seed(sampler.seed))
        self.epoch = 0
        self.batch_in_epoch = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        if self.batch_in_epoch >= len(self):  # a restored state saved at the very end of an epoch
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.sampler.epoch, self.sampler.start_batch = self.epoch, self.batch_in_epoch
        for batch in self._loader:
            # Count before yielding: a consumer holding the last batch of an epoch already sees
            # the position of the next epoch's start (so a checkpoint taken then resumes there).
            self.batch_in_epoch += 1
            if self.batch_in_epoch == len(self):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Everything needed to continue exactly where this loader is."""
        return {
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "seed": self.sampler.seed,
            "num_samples": self.sampler.num_samples,
            "batch_size": self.sampler.batch_size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict` (same dataset size and batch size)."""
        for key in ("num_samples", "batch_size"):
            mine = getattr(self.sampler, key)
            if state[key] != mine:
                raise ValueError(
                    f"dataloader state has {key}={state[key]} but this loader has {key}={mine}; "
                    f"resume with the same data files, filtering and batch size as the saved run"
                )
        if not 0 <= state["batch_in_epoch"] <= len(self):
            raise ValueError(f"dataloader state batch_in_epoch={state['batch_in_epoch']} is outside [0, {len(self)}]")
        self.sampler.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])


def build_dataloader(dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 1, *,
                     drop_last: bool = True, collate_fn: Callable | None = None,
                     num_workers: int = 0) -> ResumableDataLoader:
    """A :class:`ResumableDataLoader` over ``dataset``.

    ``collate_fn`` defaults to ``dataset.collate_fn`` (the RLHFDataset's padding collate).
    """
    if collate_fn is None:
        collate_fn = getattr(dataset, "collate_fn", None)
    sampler = ResumableBatchSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return ResumableDataLoader(dataset, sampler, collate_fn, num_workers=num_workers)
