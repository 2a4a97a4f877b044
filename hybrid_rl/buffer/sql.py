"""The persistent experience buffer: one SQL table through SQLAlchemy (SQLite file by default).

Table ``experiences`` (docs/buffer.md has the column list): one row per :class:`Experience`, token
ids and masks as JSON arrays. Several processes may share one database: ``take`` claims rows with a
single ``UPDATE ... WHERE status = 'ready' AND id IN (oldest ready ids)`` tagged with a fresh lease,
then reads back the rows carrying that lease, so two takers never get the same experience.

    from hybrid_rl.buffer import SQLBuffer
    buffer = SQLBuffer("checkpoints/hybrid_rl/run/experiences.db")
    for e in buffer.read(limit=5):
        print(e.policy_version, e.reward, e.status, e.response_text)
"""

from __future__ import annotations

import os
import uuid
from dataclasses import fields
from typing import Optional, Sequence

from sqlalchemy import JSON, Float, Integer, String, Text, create_engine, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from hybrid_rl.buffer.base import ExperienceBuffer, _check_status
from hybrid_rl.buffer.experience import Experience

__all__ = ["SQLBuffer", "as_sqlalchemy_url"]

TABLE = "experiences"


class _Base(DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = TABLE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(256), index=True)
    data_source: Mapped[str] = mapped_column(String(256))
    prompt_text: Mapped[str] = mapped_column(Text)
    response_text: Mapped[str] = mapped_column(Text)
    prompt_ids: Mapped[list] = mapped_column(JSON)
    response_ids: Mapped[list] = mapped_column(JSON)
    response_mask: Mapped[list] = mapped_column(JSON)
    rollout_log_probs: Mapped[Optional[list]] = mapped_column(JSON, nullable=True)
    reward: Mapped[float] = mapped_column(Float)
    policy_version: Mapped[int] = mapped_column(Integer, index=True)
    ground_truth: Mapped[Optional[object]] = mapped_column(JSON, nullable=True)
    extra: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), index=True)
    taken_step: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    lease: Mapped[Optional[str]] = mapped_column(String(36), nullable=True, index=True)


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


def _to_experience(row: _Row) -> Experience:
    return Experience(**{name: getattr(row, name) for name in _FIELDS})


class SQLBuffer(ExperienceBuffer):
    """Experiences in the ``experiences`` table of the database at ``path`` (created if missing)."""

    def __init__(self, path: str):
        self.url = as_sqlalchemy_url(path)
        if self.url.startswith("sqlite:///"):
            folder = os.path.dirname(self.url[len("sqlite:///"):])
            if folder:
                os.makedirs(folder, exist_ok=True)
        connect_args = {"timeout": 60} if self.url.startswith("sqlite") else {}
        self.engine = create_engine(self.url, connect_args=connect_args)
        _Base.metadata.create_all(self.engine)

    def put(self, experiences: Sequence[Experience]) -> list[int]:
        rows = [_Row(**{**{n: getattr(e, n) for n in _FIELDS if n != "id"}, "status": "ready", "taken_step": None})
                for e in experiences]
        with Session(self.engine) as session, session.begin():
            session.add_all(rows)
            session.flush()
            return [row.id for row in rows]

    def take(self, n: int, step: int, min_version: Optional[int] = None) -> list[Experience]:
        lease = str(uuid.uuid4())
        oldest = select(_Row.id).where(_Row.status == "ready")
        if min_version is not None:
            oldest = oldest.where(_Row.policy_version >= min_version)
        oldest = oldest.order_by(_Row.id).limit(n)
        claim = (update(_Row).where(_Row.status == "ready", _Row.id.in_(oldest.scalar_subquery()))
                 .values(status="taken", taken_step=step, lease=lease).execution_options(synchronize_session=False))
        with Session(self.engine) as session, session.begin():
            session.execute(claim)
            rows = session.scalars(select(_Row).where(_Row.lease == lease).order_by(_Row.id)).all()
            return [_to_experience(r) for r in rows]

    def release_after(self, step: int) -> int:
        back = (update(_Row).where(_Row.status == "taken", _Row.taken_step > step)
                .values(status="ready", taken_step=None, lease=None))
        with Session(self.engine) as session, session.begin():
            return session.execute(back).rowcount

    def drop_stale(self, version: int, max_staleness: int) -> int:
        stale = (update(_Row).where(_Row.status == "ready", _Row.policy_version < version - max_staleness)
                 .values(status="dropped"))
        with Session(self.engine) as session, session.begin():
            return session.execute(stale).rowcount

    def read(self, status: Optional[str] = None, limit: Optional[int] = None) -> list[Experience]:
        _check_status(status)
        query = select(_Row).order_by(_Row.id)
        if status is not None:
            query = query.where(_Row.status == status)
        if limit is not None:
            query = query.limit(limit)
        with Session(self.engine) as session:
            return [_to_experience(r) for r in session.scalars(query).all()]

    def count(self, status: Optional[str] = None) -> int:
        _check_status(status)
        query = select(func.count(_Row.id))
        if status is not None:
            query = query.where(_Row.status == status)
        with Session(self.engine) as session:
            return int(session.scalar(query))

    def extra_values(self, key: str, status: Optional[str] = None) -> list:
        _check_status(status)
        query = select(_Row.extra).order_by(_Row.id)  # the JSON column only: no token ids, no text
        if status is not None:
            query = query.where(_Row.status == status)
        with Session(self.engine) as session:
            return [(extra or {}).get(key) for extra in session.scalars(query).all()]

    def close(self) -> None:
        self.engine.dispose()
