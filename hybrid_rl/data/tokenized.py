"""The loop every tokenised dataset shares (SFT, reward-model pairs, DPO pairs): each loaded row is
tokenised under the ``data.bad_rows`` policy (a row that cannot be tokenised, e.g. an overlong one
under ``truncation=error``, is a bad row too), the policy's summary is given, and an empty result is
refused.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from hybrid_rl.data.bad_rows import BadRows

__all__ = ["tokenize_rows"]

Item = TypeVar("Item")
Row = TypeVar("Row")


def tokenize_rows(loaded: Iterable[tuple[str, int, Item]], policy: BadRows, tokenize: Callable[[Item], Row],
                  empty: str) -> tuple[list[Item], list[Row]]:
    """``(items, rows)``: every loaded ``(path, index, item)`` whose ``tokenize(item)`` succeeded, in
    order, with its tokenised row. Runs ``policy.finish()``; a ``ValueError(empty)`` when no row is left."""
    items: list[Item] = []
    rows: list[Row] = []
    for path, index, item in loaded:
        row = policy.parse(path, index, tokenize, item, again=True)  # the row was counted when it was loaded
        if row is not None:
            items.append(item)
            rows.append(row)
    policy.finish()
    if not rows:
        raise ValueError(empty)
    return items, rows

