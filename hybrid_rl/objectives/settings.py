"""Checks that more than one objective's config runs on the same kind of setting."""

from __future__ import annotations

from hybrid_rl.algorithms.loss_agg import LOSS_AGG_MODES

__all__ = ["check_loss_agg_mode"]


def check_loss_agg_mode(mode: str, key: str) -> None:
    """A one-line ``ValueError`` naming ``key`` (e.g. ``critic.loss_agg_mode``) unless ``mode`` is one
    of :data:`~hybrid_rl.algorithms.loss_agg.LOSS_AGG_MODES`."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"{key}={mode!r} is not a loss aggregation mode; valid: {list(LOSS_AGG_MODES)}. "
                         "Fix: pick one of them.")
