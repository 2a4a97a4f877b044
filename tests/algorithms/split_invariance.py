"""Helper for the micro-batch / data-parallel split invariance tests of the loss functions.

A loss is computed (a) on the whole mini-batch with local denominators and (b) split over fake
"ranks", each holding several micro-batches, with the global denominators obtained by summing
``global_batch_denominators`` over every piece (what an all-reduce(SUM) gives). Each micro-batch loss
is multiplied by ``dp_size`` before backward and the per-rank gradients are averaged, exactly as
FSDP/DDP would. The summed loss and the averaged gradient must equal the whole-batch ones.
"""

from typing import Callable

import torch

from hybrid_rl.algorithms import global_batch_denominators

LossFn = Callable[[torch.Tensor, dict], torch.Tensor]  # (row indices, global denominators) -> scalar


def partitions(batch_size: int, seed: int = 0) -> list[list[list[torch.Tensor]]]:
    """Layouts to test: 1 rank x 3 micro-batches, and 2 ranks x 2 uneven micro-batches (shuffled rows)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(batch_size, generator=gen)
    cut = [0, 2, batch_size // 2, batch_size // 2 + 3, batch_size]
    two_ranks = [[perm[cut[0]:cut[1]], perm[cut[1]:cut[2]]], [perm[cut[2]:cut[3]], perm[cut[3]:cut[4]]]]
    rows = torch.arange(batch_size)
    one_rank = [[rows[:1], rows[1:5], rows[5:]]]
    return [one_rank, two_ranks]


def assert_split_invariant(loss_fn: LossFn, param: torch.Tensor, mask: torch.Tensor, layout) -> None:
    param.grad = None
    full = loss_fn(torch.arange(mask.shape[0]), {})
    full.backward()
    full_grad = param.grad.clone()

    pieces = [rows for rank in layout for rows in rank]
    dens = {k: sum(global_batch_denominators(mask[rows])[k] for rows in pieces) for k in
            ("global_batch_num_tokens", "global_batch_num_seqs")}
    dp_size = len(layout)
    total, rank_grads = torch.zeros((), dtype=full.dtype), []
    for rank in layout:
        param.grad = None
        for rows in rank:
            loss = loss_fn(rows, dens)
            (loss * dp_size).backward()  # cancels the gradient averaging of FSDP/DDP
            total = total + loss.detach()
        rank_grads.append(param.grad.clone())
    averaged = torch.stack(rank_grads).mean(0)  # what all-reduce(AVG) produces
    assert torch.allclose(total, full.detach(), atol=1e-10, rtol=1e-9), (total, full)
    assert torch.allclose(averaged, full_grad, atol=1e-10, rtol=1e-9), (averaged, full_grad)
