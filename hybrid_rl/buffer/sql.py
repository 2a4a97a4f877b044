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

Values are stored faithfully (NUL, NaN, infinities, any Unicode; :mod:`hybrid_rl.buffer.codec`), each
row recording its ``codec``; a table written before the ``codec`` column existed gains it when opened
(its rows are read as they were stored). Creating or migrating a table is safe from several
processes at once (a PostgreSQL advisory lock, and a re-check after a lost race elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import uuid
import zlib
from dataclasses import fields
from typing import Any, Optional, Sequence

from sqlalchemy import (JSON, Column, Engine, Float, Integer, MetaData, String, Table, Text, create_engine, delete,
                        func, insert, inspect, select, text, update)
from sqlalchemy.engine import Connection, Dialect, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.types import TypeDecorator

from hybrid_rl.buffer.base import TABLE_NAME, ExperienceBuffer, _check_status
from hybrid_rl.buffer.codec import CODEC_VERSION, decode_float, decode_json, decode_text, encode_json, encode_text
from hybrid_rl.buffer.experience import Experience, check_experience

__all__ = ["DEFAULT_TABLE", "NotABufferTable", "SQLBuffer", "as_sqlalchemy_url", "table_name"]

DEFAULT_TABLE = "experiences"
SKIP_LOCKED_DIALECTS = ("postgresql", "mysql", "mariadb", "oracle")
"""Databases whose ``SELECT ... FOR UPDATE SKIP LOCKED`` claims rows without waiting."""


def table_name(name: str) -> str:
    """A buffer (or experiment) name as a table name every database accepts: lower case, ``[a-z0-9_]``,
    at most 63 characters, not starting with a digit."""
    cleaned = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or DEFAULT_TABLE
    cleaned = cleaned if not cleaned[0].isdigit() else f"exp_{cleaned}"
    return cleaned[:63]


class JSONText(TypeDecorator):
    """JSON that SQLite stores as TEXT: its ``JSON`` column type has NUMERIC affinity, which turns a
    scalar's text into a number (``1.0`` -> 1, ``-0.0`` -> 0, ``2**63+1`` -> a float). Other databases
    get their JSON type. A table created with ``JSON`` columns still reads (a number comes back as is)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect):
        return dialect.type_descriptor(Text() if dialect.name == "sqlite" else JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "sqlite" or value is None:
            return value
        return json.dumps(value, ensure_ascii=False)  # the codec has tagged every NaN and inf

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "sqlite" and isinstance(value, str):
            return json.loads(value)
        return value


_WIDE_TEXT = Text().with_variant(String(256), "mysql", "mariadb")
"""A key of any length (the codec's escape doubles a NUL); MySQL indexes no unbounded TEXT."""


def _table(name: str, metadata: MetaData) -> Table:
    return Table(
        name, metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("uid", _WIDE_TEXT, index=True),
        Column("data_source", _WIDE_TEXT),
        Column("prompt_text", Text),
        Column("response_text", Text),
        Column("prompt_ids", JSONText),
        Column("response_ids", JSONText),
        Column("response_mask", JSONText),
        Column("rollout_log_probs", JSONText, nullable=True),
        Column("token_rewards", JSONText, nullable=True),  # NULL: the reward on the last model token
        Column("token_versions", JSONText, nullable=True),  # NULL: every model token of policy_version
        Column("reward", Float),
        Column("policy_version", Integer, index=True),
        Column("ground_truth", JSONText, nullable=True),
        Column("extra", JSONText),
        Column("created_at", Float),
        Column("status", String(16), index=True),
        Column("taken_step", Integer, nullable=True),
        Column("lease", String(36), nullable=True, index=True),
        Column("codec", Integer, nullable=True),  # hybrid_rl.buffer.codec; NULL = written before it existed
    )


_FIELDS = [f.name for f in fields(Experience)]
_TEXT_FIELDS = ("uid", "data_source", "prompt_text", "response_text")
_JSON_FIELDS = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "token_rewards", "token_versions",
                "ground_truth", "extra")
_ADDED_COLUMNS = ("codec", "token_rewards", "token_versions")
"""Nullable columns a table of an earlier hybrid_rl lacks: added when it is opened (its rows read None)."""
_FLOAT_FIELDS = ("reward", "created_at")
_DRIVERLESS_POSTGRES = ("postgres", "postgresql")
"""``postgres://`` (Heroku's and libpq's spelling) and ``postgresql://`` name no driver: psycopg 3 is
the one hybrid_rl installs (its ``postgres`` extra); SQLAlchemy would pick psycopg2 or fail."""


class NotABufferTable(ValueError):
    """The table exists but lacks columns an experience buffer has (another program's table)."""


def _unparsed_url(path: str) -> str:
    """A URL that does not parse, shown without what may be a password (all before its last ``@``)."""
    from hybrid_rl.utils.redact import redact_url

    shown = redact_url(path)
    if "@" in shown and "***" not in shown:
        shown = shown.split("://", 1)[0] + "://***@" + shown.rsplit("@", 1)[1]
    return shown


_URL_EXAMPLES = "sqlite:///experiences.db, postgresql+psycopg://user:password@host/db or a plain file path"


def _parsed(path: str):
    """``make_url(path)``, or a one-line ``ValueError`` that shows the URL redacted and never the
    parser's own words (they quote the raw URL: a port that is not a number may be a password)."""
    try:
        url = make_url(path)
    except (ArgumentError, ValueError):
        raise ValueError(f"{_unparsed_url(path)!r} is not a valid SQLAlchemy URL (after the host, ':' takes a port "
                         f"number; a password is written user:password@host). Fix: use e.g. {_URL_EXAMPLES}.") from None
    if "@" in (url.host or ""):  # SQLAlchemy splits at the first '@': the password's tail became the host
        raise ValueError(f"{_unparsed_url(path)!r}: its host holds an '@'. Fix: percent-encode '@' in the password "
                         "as %40.")
    if url.get_backend_name() == "sqlite" and (url.username or url.password or url.host or url.port):
        raise ValueError(f"{_unparsed_url(path)!r}: a SQLite URL names a file, with no user, password or host. Fix: "
                         "use sqlite:///relative/file.db, sqlite:////absolute/file.db or a plain file path.")
    return url


def as_sqlalchemy_url(path: str) -> str:
    """A SQLAlchemy URL (``postgres://`` and ``postgresql://`` with the psycopg driver named); a plain
    file path as ``sqlite:///<absolute path>``. A URL that does not parse, whose host holds an ``@``
    (an unescaped one in the password) or a SQLite URL with a user or host is a one-line ``ValueError``."""
    if "://" in path:
        url = _parsed(path)
        if url.drivername in _DRIVERLESS_POSTGRES:
            return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        return path
    return "sqlite:///" + os.path.abspath(os.path.expanduser(path))


def _encode_row(e: Experience) -> dict[str, Any]:
    row = {n: getattr(e, n) for n in _FIELDS if n != "id"}
    row.update({n: encode_text(row[n]) for n in _TEXT_FIELDS})
    row.update({n: encode_json(row[n]) for n in _JSON_FIELDS})
    return {**row, "status": "ready", "taken_step": None, "codec": CODEC_VERSION}


def _to_experience(row: Any) -> Experience:
    values = {name: row._mapping[name] for name in _FIELDS}
    if row._mapping["codec"] is not None:  # None: a row written before the codec, stored as given
        values.update({n: decode_text(values[n]) for n in _TEXT_FIELDS})
        values.update({n: decode_json(values[n]) for n in _JSON_FIELDS})
    values.update({n: decode_float(values[n]) for n in _FLOAT_FIELDS})  # SQLite's NULL was a NaN
    return Experience(**values)


def _lock_key(name: str) -> int:
    """A PostgreSQL advisory lock id (bigint) for creating or migrating table ``name``."""
    return zlib.crc32(f"hybrid_rl.buffer:{name}".encode())


def _columns(conn: Connection, name: str) -> Optional[set[str]]:
    """The column names of table ``name``; None when there is no such table."""
    inspector = inspect(conn)
    return {c["name"] for c in inspector.get_columns(name)} if inspector.has_table(name) else None


def _create_or_migrate(conn: Connection, table: Table) -> None:
    """Create ``table`` (with its indexes) if missing; add the :data:`_ADDED_COLUMNS` a table from
    before them lacks."""
    if conn.dialect.name == "postgresql":  # one creator at a time (pg_type's unique index otherwise)
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _lock_key(table.name)})
    table.metadata.create_all(conn)
    have = _columns(conn, table.name) or set()
    missing = {c.name for c in table.columns} - have - set(_ADDED_COLUMNS)
    if missing:
        raise NotABufferTable(f"table {table.name!r} exists but is not an experience buffer: it lacks the columns "
                              f"{sorted(missing)}")
    preparer = conn.dialect.identifier_preparer
    quoted = preparer.quote(table.name)
    for name in (n for n in _ADDED_COLUMNS if n not in have):
        kind = table.c[name].type.compile(dialect=conn.dialect)  # INTEGER; TEXT (SQLite) or JSON
        conn.execute(text(f"ALTER TABLE {quoted} ADD COLUMN {preparer.quote(name)} {kind}"))
    if conn.dialect.name == "postgresql":  # a table from before: varchar(256) keys (SQLite ignores lengths)
        narrow = [c["name"] for c in inspect(conn).get_columns(table.name)
                  if c["name"] in ("uid", "data_source") and getattr(c["type"], "length", None) is not None]
        if narrow:
            conn.execute(text(f"ALTER TABLE {quoted} " + ", ".join(f"ALTER COLUMN {n} TYPE text" for n in narrow)))


def prepare_table(engine: Engine, table: Table, attempts: int = 3) -> None:
    """:func:`_create_or_migrate` in one transaction; a race lost to another process (its table, index
    or column appeared meanwhile: SQLite, or a server without advisory locks) is retried."""
    for attempt in range(attempts):
        try:
            with engine.begin() as conn:
                _create_or_migrate(conn, table)
            return
        except DBAPIError:
            with engine.connect() as conn:
                if attempt == attempts - 1 or not _columns(conn, table.name):
                    raise


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
        prepare_table(self.engine, self.table)
        self._skip_locked = self.engine.dialect.name in SKIP_LOCKED_DIALECTS

    def put(self, experiences: Sequence[Experience]) -> list[int]:
        for e in experiences:
            check_experience(e)
        rows = [_encode_row(e) for e in experiences]
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
        query = select(t.c.extra, t.c.codec).order_by(t.c.id)  # no token ids, no text
        if status is not None:
            query = query.where(t.c.status == status)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [((decode_json(extra) if codec is not None else extra) or {}).get(key) for extra, codec in rows]

    def close(self) -> None:
        self.engine.dispose()
