"""Where hybrid_rl keeps what it computes once per machine (converted models, probes, tasks)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HYBRID_RL_CACHE"


def cache_root() -> Path:
    """Root of hybrid_rl's cache: ``$HYBRID_RL_CACHE`` or ``~/.cache/hybrid_rl``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/hybrid_rl").expanduser()
