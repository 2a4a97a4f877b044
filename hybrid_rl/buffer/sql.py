"""The persistent experience buffer: one SQL table per buffer name, through SQLAlchemy (a SQLite file
by default, any server database by URL).

Table ``<name>`` (default ``experiences``; docs/buffer.md has the column list): one row per
:class:`Experience`, token ids and masks as JSON arrays. Several runs may share one database, each
in its own table (Trinity-RFT's buffer names), and several processes one table. ``take`` claims the
oldest ready rows under a fresh lease, then reads back the rows carrying that lease, so two takers
never get the same experience. How it claims depends on the database:

* with row locks that can be skipped (PostgreSQL, MySQL 8, Oracle): ``SELECT id ... ORDER BY id
  LIMIT n FOR UPDATE SKIP LOCKED``, then ``UPDATE ... WHERE id IN (those ids)``, in one transaction:
  concurrent takers each get distinct rows and none waits on another (MySQL also rejects an UPDATE
  whose subquery reads its own table);
* otherwise (SQLite, which locks the whole database for a writer): one ``UPDATE ... WHERE id IN
  (SELECT ... LIMIT n)`` statement.

    from hybrid_rl.buffer import SQLBuffer
    buffer = SQLBuffer("checkpoints/hybrid_rl/run/experiences.db")
    for e in buffer.read(limit=5):
        print(e.policy_version, e.reward, e.status, e.response_text)
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import fields
from typing import Any, Optional, Sequence

from sqlalchemy import (JSON, Column, Float, Integer, MetaData, String, Table, Text, create_engine, delete, func,
                        insert, select, update)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from hybrid_rl.buffer.base import TABLE_NAME, ExperienceBuffer, _check_status
from hybrid_rl.buffer.experience import Experience

__all__ = ["DEFAULT_TABLE", "SQLBuffer", "as_sqlalchemy_url", "table_name"]

DEFAULT_TABLE = "experiences"
SKIP_LOCKED_DIALECTS = ("postgresql", "mysql", "mariadb", "oracle")
"""Databases whose ``SELECT ... FOR UPDATE SKIP LOCKED`` claims rows without waiting."""


def table_name(name: str) -> str:
    """A buffer (or experiment) name as a table name every database accepts: lower case, ``[a-z0-9_]``,
    at most 63 characters, not starting with a digit."""
    cleaned = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or DEFAULT_TABLE
    cleaned = cleaned if not cleaned[0].isdigit() else f"exp_{cleaned}"
    return cleaned[:63]


def _table(name: str, metadata: MetaData) -> Table:
    return Table(
        name, metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("uid", String(256), index=True),
        Column("data_source", String(256)),
        Column("prompt_text", Text),
        Column("response_text", Text),
        Column("prompt_ids", JSON),
        Column("response_ids", JSON),
        Column("response_mask", JSON),
        Column("rollout_log_probs", JSON, nullable=True),
        Column("reward", Float),
        Column("policy_version", Integer, index=True),
        Column("ground_truth", JSON, nullable=True),
        Column("extra", JSON),
        Column("created_at", Float),
        Column("status", String(16), index=True),
        Column("taken_step", Integer, nullable=True),
        Column("lease", String(36), nullable=True, index=True),
    )


_FIELDS = [f.name for f in fields(Experience)]


def as_sqlalchemy_url(path: str) -> str:
    """A SQLAlchemy URL as is; a plain file path as ``sqlite:///<absolute path>``."""
    if "://" in path:
        try:
            make_url(path)
        except ArgumentError as exc:
            raise ValueError(f"buffer.path={path!r} is not a valid SQLAlchemy URL ({exc}). Fix: use e.g. "
                             "sqlite:///experiences.db or a plain file path.") from None
        return path
    return "sqlite:///" + os.path.abspath(os.path.expanduser(path))


def _to_experience(row: Any) -> Experience:
    return Experience(**{name: row._mapping[name] for name in _FIELDS})


class SQLBuffer(ExperienceBuffer):
    """Experiences in table ``name`` of the database at ``path`` (both created if missing)."""

    def __init__(self, path: str, name: str = DEFAULT_TABLE):
        if not TABLE_NAME.match(name):
            raise ValueError(f"async_training.buffer.name={name!r} is not a table name: use lower-case letters, digits "
                             f"and _ (at most 63, not starting with a digit), e.g. {table_name(name)!r}.")
        self.url, self.name = as_sqlalchemy_url(path), name
        if self.url.startswith("sqlite:///"):
            folder = os.path.dirname(self.url[len("sqlite:///"):])
            if folder:
                os.makedirs(folder, exist_ok=True)
        connect_args = {"timeout": 60} if self.url.startswith("sqlite") else {}
        self.engine = create_engine(self.url, connect_args=connect_args)
        self.table = _table(name, MetaData())
        self.table.metadata.create_all(self.engine)
        self._skip_locked = self.engine.dialect.name in SKIP_LOCKED_DIALECTS

    def put(self, experiences: Sequence[Experience]) -> list[int]:
        rows = [{**{n: getattr(e, n) for n in _FIELDS if n != "id"}, "status": "ready", "taken_step": None}
                for e in experiences]
        t = self.table
        with self.engine.begin() as conn:
            if self.engine.dialect.insert_executemany_returning_sort_by_parameter_order and rows:
                return list(conn.scalars(insert(t).returning(t.c.id, sort_by_parameter_order=True), rows))
            return [conn.execute(insert(t), row).inserted_primary_key[0] for row in rows]

    def take(self, n: int, step: int, min_version: Optional[int] = None) -> list[Experience]:
        t, lease = self.table, str(uuid.uuid4())
        oldest = select(t.c.id).where(t.c.status == "ready")
        if min_version is not None:
            oldest = oldest.where(t.c.policy_version >= min_version)
        oldest = oldest.order_by(t.c.id).limit(n)
        claim = update(t).where(t.c.status == "ready").values(status="taken", taken_step=step, lease=lease)
        with self.engine.begin() as conn:
            if self._skip_locked:
                ids = list(conn.scalars(oldest.with_for_update(skip_locked=True)))
                if ids:
                    conn.execute(claim.where(t.c.id.in_(ids)))
            else:
                conn.execute(claim.where(t.c.id.in_(oldest.scalar_subquery())))
            rows = conn.execute(select(t).where(t.c.lease == lease).order_by(t.c.id)).all()
            return [_to_experience(r) for r in rows]

    def release_after(self, step: int) -> int:
        t = self.table
        back = (update(t).where(t.c.status == "taken", t.c.taken_step > step)
                .values(status="ready", taken_step=None, lease=None))
        with self.engine.begin() as conn:
            return conn.execute(back).rowcount

    def drop_stale(self, version: int, max_staleness: int) -> int:
        t = self.table
        stale = update(t).where(t.c.status == "ready", t.c.policy_version < version - max_staleness).values(status="dropped")
        with self.engine.begin() as conn:
            return conn.execute(stale).rowcount

    def discard_newer(self, version: int) -> int:
        t = self.table
        with self.engine.begin() as conn:
            return conn.execute(delete(t).where(t.c.status == "ready", t.c.policy_version > version)).rowcount

    def read(self, status: Optional[str] = None, limit: Optional[int] = None) -> list[Experience]:
        _check_status(status)
        t = self.table
        query = select(t).order_by(t.c.id)
        if status is not None:
            query = query.where(t.c.status == status)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_to_experience(r) for r in conn.execute(query).all()]

    def count(self, status: Optional[str] = None) -> int:
        _check_status(status)
        t = self.table
        query = select(func.count(t.c.id))
        if status is not None:
            query = query.where(t.c.status == status)
        with self.engine.connect() as conn:
            return int(conn.scalar(query))

    def extra_values(self, key: str, status: Optional[str] = None) -> list:
        _check_status(status)
        t = self.table
        query = select(t.c.extra).order_by(t.c.id)  # the JSON column only: no token ids, no text
        if status is not None:
            query = query.where(t.c.status == status)
        with self.engine.connect() as conn:
            return [(extra or {}).get(key) for extra in conn.scalars(query).all()]

    def close(self) -> None:
        self.engine.dispose()
