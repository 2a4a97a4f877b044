"""Split a rank's rows into micro-batches: fixed row count, or token-balanced (dynamic batch size).

Dynamic batch size packs rows by their number of valid tokens (``attention_mask.sum(-1)``) into
``k`` micro-batches of at most ``max_token_len`` tokens, balanced with the LPT greedy rule (longest
row first, into the currently lightest micro-batch). ``k`` starts at ``ceil(total / max_token_len)``
and grows until every micro-batch fits. Under data parallelism every rank must run the same number
of forward/backward passes (each one gathers FSDP shards collectively), so ``k`` is the maximum over
the ranks.

A paired objective's rows come in (chosen, rejected) pairs, rows ``2i`` and ``2i + 1``
(:attr:`hybrid_rl.objectives.ObjectiveInfo.paired`); ``paired=True`` keeps both rows of a pair in
one micro-batch: fixed sizes must then be even, and dynamic batching balances whole pairs.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional

import torch
import torch.distributed as dist

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.packing import group_token_counts, has_shared_prompts, prompt_groups


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(tensor: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Sum of ``tensor`` over all ranks (a copy; identity without a process group)."""
    out = tensor.detach().to(device=device, dtype=torch.float64).clone()
    if _dist_on():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(tensor.dtype).cpu()


def all_reduce_max_int(value: int, device: torch.device | str = "cpu") -> int:
    """Maximum of an integer over all ranks."""
    if not _dist_on():
        return value
    out = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return int(out.item())


def balanced_partitions(seqlens: list[int], k: int) -> list[list[int]]:
    """Partition row indices into ``k`` non-empty groups with near-equal token sums (LPT greedy).

    Returns groups of ascending indices, ordered by their smallest index (deterministic).
    """
    if not 1 <= k <= len(seqlens):
        raise ValueError(f"cannot split {len(seqlens)} rows into {k} non-empty micro-batches")
    order = sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i))
    groups: list[list[int]] = [[] for _ in range(k)]
    heap = [(0, g) for g in range(k)]  # (tokens, group id)
    for i in order:
        load, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (load + seqlens[i], g))
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def dynamic_partitions(seqlens: list[int], max_token_len: int, key: str,
                       device: torch.device | str = "cpu",
                       units: Optional[tuple[list[list[int]], list[int]]] = None,
                       keep_units: bool = False) -> list[list[int]]:
    """Token-balanced micro-batches (lists of row indices) of at most ``max_token_len`` tokens each.

    ``units`` ``(row lists, token costs)`` are balanced instead of single rows when given (rows
    sharing a prompt, see :func:`split_micro_batches`); if another rank needs more micro-batches
    than there are units here, single rows are balanced instead (``keep_units``: a ValueError, as
    for pairs that must stay whole). ``key`` names the config field in the error raised when a
    single row is longer than the budget.
    """
    longest = max(seqlens)
    if longest > max_token_len:
        raise ValueError(f"{key}={max_token_len} is smaller than one row of {longest} tokens "
                         "(prompt + response). Fix: raise it to at least "
                         "max_prompt_length + max_response_length.")
    members, costs = units if units is not None else ([[i] for i in range(len(seqlens))], seqlens)
    k = max(1, math.ceil(sum(costs) / max_token_len))
    while True:
        parts = balanced_partitions(costs, k)
        if all(sum(costs[u] for u in p) <= max_token_len for p in parts) or k == len(costs):
            break
        k += 1
    k_all = all_reduce_max_int(k, device)
    if k_all > len(costs):  # more passes than units here: balance single rows
        if keep_units:
            raise ValueError(f"this rank has {len(costs)} (chosen, rejected) pairs but another needs {k_all} "
                             "micro-batches; give every data-parallel rank the same number of pairs")
        members, costs = [[i] for i in range(len(seqlens))], seqlens
    if k_all != k:  # another rank needs more passes: re-balance into as many
        parts = balanced_partitions(costs, min(k_all, len(costs)))
    if len(parts) < k_all:
        raise ValueError(f"this rank has {len(seqlens)} rows but another needs {k_all} "
                         "micro-batches; give every data-parallel rank the same number of rows")
    return sorted((sorted(i for u in p for i in members[u]) for p in parts), key=lambda g: g[0])


def _prompt_units(data: DataProto, max_token_len: int) -> Optional[tuple[list[list[int]], list[int]]]:
    """Rows grouped by shared prompt and each group's token count with the prompt counted once;
    None when no prompt is shared or a group alone exceeds ``max_token_len``."""
    mask = data.batch["attention_mask"]
    response_length = data.batch["responses"].shape[1]
    units = prompt_groups(data.batch["input_ids"], mask, response_length)
    if not has_shared_prompts(units):
        return None
    costs = group_token_counts(mask, response_length, units)
    return (units, costs) if max(costs) <= max_token_len else None


def check_whole_pairs(num_rows: int, what: str, key: Optional[str] = None) -> None:
    """ValueError unless ``num_rows`` (the rows of ``what``; set by the config ``key`` when given)
    holds whole (chosen, rejected) pairs."""
    if num_rows % 2:
        fix = f"make {key} even" if key else "make it an even number of rows"
        raise ValueError(f"a paired objective keeps rows 2i and 2i+1 (a chosen and a rejected response) together, "
                         f"but {what} is {num_rows} rows. Fix: {fix}.")


def _pair_units(data: DataProto, seqlens: list[int], max_token_len: int,
                key: str) -> tuple[list[list[int]], list[int]]:
    """Rows ``(2i, 2i + 1)`` as units and their token counts; a ValueError when a pair exceeds the budget."""
    check_whole_pairs(len(data), "the batch")
    units = [[i, i + 1] for i in range(0, len(data), 2)]
    costs = [seqlens[i] + seqlens[i + 1] for i in range(0, len(data), 2)]
    if max(costs) > max_token_len:
        raise ValueError(f"{key}={max_token_len} is smaller than one (chosen, rejected) pair of {max(costs)} tokens, "
                         "which a paired objective keeps in one micro-batch. Fix: raise it to at least twice "
                         "the longest row.")
    return units, costs


def split_micro_batches(data: DataProto, *, micro_batch_size: Optional[int],
                        use_dynamic_bsz: bool, max_token_len: Optional[int], key: str,
                        device: torch.device | str = "cpu", group_prompts: bool = False,
                        paired: bool = False) -> tuple[list[DataProto], Optional[list[int]]]:
    """Micro-batches of ``data`` and, under dynamic batch size, the row order they imply.

    Returns ``(micro_batches, order)``: ``order`` is None for fixed-size splitting (rows stay in
    order); otherwise ``concat(micro_batches)`` holds the rows ``order`` of ``data``. With
    ``group_prompts`` (the prefix grouper) dynamic batching keeps the rows sharing a prompt in one
    micro-batch and counts that prompt's tokens once. ``paired`` keeps rows ``2i`` and ``2i + 1``
    in one micro-batch (a paired objective's pairs; see the module docstring).
    """
    if not use_dynamic_bsz:
        if micro_batch_size is None:
            raise ValueError(f"{key}: a micro-batch size is required when use_dynamic_bsz is false")
        if paired:
            check_whole_pairs(micro_batch_size, "a micro-batch")
            check_whole_pairs(len(data), "the batch")
        return data.split(micro_batch_size), None
    seqlens = data.batch["attention_mask"].sum(-1).tolist()
    if paired:
        units = _pair_units(data, seqlens, max_token_len, key)
    else:
        units = _prompt_units(data, max_token_len) if group_prompts else None
    groups = dynamic_partitions(seqlens, max_token_len, key, device, units, keep_units=paired)
    order = [i for g in groups for i in g]
    return [data.select_idxs(g) for g in groups], order


def restore_order(tensor: torch.Tensor, order: Optional[list[int]]) -> torch.Tensor:
    """Undo the permutation of :func:`split_micro_batches` on a ``[B, ...]`` result."""
    if order is None:
        return tensor
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return tensor[inverse]
