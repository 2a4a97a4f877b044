"""The experience buffer interface, its typed config, and the in-memory backend.

Life of an experience: ``put`` (status ``ready``) -> ``take`` hands the oldest ready ones to the
trainer and marks them ``taken`` at that trainer step -> the step's checkpoint makes that final. If
the run dies before the checkpoint, ``release_after(step)`` (called on resume with the checkpointed
step) puts everything taken after it back to ``ready``: nothing buffered is lost and nothing is trained
on twice. ``drop_stale(version, max_staleness)`` marks ready experiences more than ``max_staleness``
policy versions old as ``dropped`` (kept for inspection, never trained on) and returns how many.
``discard_newer(version)`` deletes ready experiences sampled by weights newer than a restored
checkpoint's (resume), so that their prompts are generated again by the weights that exist.
"""

from __future__ import annotations

import copy
import re
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hybrid_rl.buffer.experience import STATUSES, Experience, check_experience

__all__ = ["BUFFER_STORAGE_TYPES", "BufferConfig", "ExperienceBuffer", "MemoryBuffer"]

BUFFER_STORAGE_TYPES = ("memory", "sql")
TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
"""A buffer name every SQL database accepts as a table name."""


@dataclass(kw_only=True)
class BufferConfig:
    """Where experiences live (Trinity-RFT's ``storage_type`` / ``path`` names)."""

    storage_type: str = "memory"
    """memory (in this process; saved with each checkpoint) or sql (a database through SQLAlchemy)."""
    path: Optional[str] = None
    """sql: a SQLAlchemy URL (``sqlite:///run/experiences.db``, ``postgresql+psycopg://...``) or a plain
    file path (SQLite). null = ``experiences.db`` in the run folder."""
    name: Optional[str] = None
    """sql: the table this run's experiences go to (Trinity-RFT's buffer name), so that several runs
    share one database. null = ``experiences`` in the run folder's own file, else the run's
    ``trainer.experiment_name`` made a table name (lower case, ``[a-z0-9_]``)."""

    def __post_init__(self) -> None:
        if self.storage_type not in BUFFER_STORAGE_TYPES:
            raise ValueError(f"async_training.buffer.storage_type={self.storage_type!r} is invalid: must be one of "
                             f"{BUFFER_STORAGE_TYPES}. Fix: use memory or sql.")
        if self.name is not None and not TABLE_NAME.match(self.name):
            raise ValueError(f"async_training.buffer.name={self.name!r} is not a table name: use lower-case letters, "
                             "digits and _ (at most 63, not starting with a digit).")


class ExperienceBuffer(ABC):
    """Experiences in insertion order; every method is atomic (safe from several threads)."""

    @abstractmethod
    def put(self, experiences: Sequence[Experience]) -> list[int]:
        """Store ``experiences`` as ready; returns their ids (increasing). A row whose per-token
        lists do not match its response (:func:`check_experience`) is a ``ValueError``; none is stored."""

    @abstractmethod
    def take(self, n: int, step: int, min_version: Optional[int] = None) -> list[Experience]:
        """Up to ``n`` of the oldest ready experiences (with ``policy_version >= min_version``), marked
        taken at ``step``."""

    @abstractmethod
    def release_after(self, step: int) -> int:
        """Put experiences taken at a step > ``step`` back to ready (resume); returns how many."""

    @abstractmethod
    def drop_stale(self, version: int, max_staleness: int) -> int:
        """Mark ready experiences with ``policy_version < version - max_staleness`` dropped; returns how many."""

    @abstractmethod
    def discard_newer(self, version: int) -> int:
        """Delete ready experiences with ``policy_version > version`` (a resume: they were sampled by
        weights of the dead run that the restored run will never have); returns how many."""

    @abstractmethod
    def read(self, status: Optional[str] = None, limit: Optional[int] = None) -> list[Experience]:
        """Experiences (all, or of one status) in insertion order, without changing them."""

    @abstractmethod
    def count(self, status: Optional[str] = None) -> int:
        """How many experiences (of one status)."""

    @abstractmethod
    def extra_values(self, key: str, status: Optional[str] = None) -> list[Any]:
        """``extra[key]`` of every experience (of one status; None where absent), in insertion order,
        without reading the token ids."""

    def close(self) -> None:
        """Release connections (the data stays where the backend keeps it)."""


def _check_status(status: Optional[str]) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"status={status!r} is invalid: must be one of {STATUSES} or None.")


class MemoryBuffer(ExperienceBuffer):
    """Experiences in a Python list. ``state_dict``/``load_state_dict`` carry them through checkpoints."""

    def __init__(self) -> None:
        self._items: list[Experience] = []
        self._next_id = 1
        self._lock = threading.Lock()

    def put(self, experiences: Sequence[Experience]) -> list[int]:
        for e in experiences:
            check_experience(e)
        with self._lock:
            ids = []
            for e in experiences:
                e = copy.deepcopy(e)
                e.id, e.status, e.taken_step = self._next_id, "ready", None
                self._next_id += 1
                self._items.append(e)
                ids.append(e.id)
            return ids

    def take(self, n: int, step: int, min_version: Optional[int] = None) -> list[Experience]:
        with self._lock:
            out = []
            for e in self._items:
                if len(out) == n:
                    break
                if e.status == "ready" and (min_version is None or e.policy_version >= min_version):
                    e.status, e.taken_step = "taken", step
                    out.append(copy.deepcopy(e))
            return out

    def release_after(self, step: int) -> int:
        with self._lock:
            back = [e for e in self._items if e.status == "taken" and e.taken_step > step]
            for e in back:
                e.status, e.taken_step = "ready", None
            return len(back)

    def drop_stale(self, version: int, max_staleness: int) -> int:
        with self._lock:
            stale = [e for e in self._items if e.status == "ready" and e.policy_version < version - max_staleness]
            for e in stale:
                e.status = "dropped"
            return len(stale)

    def discard_newer(self, version: int) -> int:
        with self._lock:
            kept = [e for e in self._items if not (e.status == "ready" and e.policy_version > version)]
            gone, self._items = len(self._items) - len(kept), kept
            return gone

    def read(self, status: Optional[str] = None, limit: Optional[int] = None) -> list[Experience]:
        _check_status(status)
        with self._lock:
            items = [copy.deepcopy(e) for e in self._items if status is None or e.status == status]
        return items[:limit] if limit is not None else items

    def count(self, status: Optional[str] = None) -> int:
        _check_status(status)
        with self._lock:
            return sum(1 for e in self._items if status is None or e.status == status)

    def extra_values(self, key: str, status: Optional[str] = None) -> list[Any]:
        _check_status(status)
        with self._lock:
            return [e.extra.get(key) for e in self._items if status is None or e.status == status]

    def forget_taken(self, step: int) -> int:
        """Remove experiences taken at a step <= ``step`` (a checkpoint made them final) and dropped
        ones, so a long run does not keep every row it saw; returns how many. Ids stay increasing."""
        with self._lock:
            keep = [e for e in self._items
                    if e.status == "ready" or (e.status == "taken" and e.taken_step > step)]
            removed, self._items = len(self._items) - len(keep), keep
            return removed

    def state_dict(self) -> dict[str, Any]:
        """Every experience as a plain dict (for the checkpoint)."""
        with self._lock:
            return {"experiences": [e.to_dict() for e in self._items], "next_id": self._next_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._items = [Experience(**d) for d in state["experiences"]]
            self._next_id = int(state.get("next_id", max((e.id or 0 for e in self._items), default=0) + 1))
