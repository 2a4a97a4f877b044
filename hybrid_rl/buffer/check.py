"""Checks of a buffer's database before anything is generated: one line that names the key and the fix.

:func:`open_checked` connects to the database of a buffer path or URL, creates or verifies the table,
checks that this user may insert, update and delete its rows (nothing is written: the statements
match no row and are rolled back), and on PostgreSQL that the database stores UTF-8. Every failure
is a ``ValueError`` of one line with the password hidden, e.g.::

    async_training.buffer.path='postgresql+psycopg://me:***@db/rl': cannot connect (connection failed: ...
    password authentication failed for user "me"). Fix: check the user, password, host, port and
    database name in the URL, and that the server runs and accepts this user.

The trainer runs it before Ray and the workers start (``hybrid_rl.trainer.ppo.preflight``), and
``python -m hybrid_rl.debug rollout --output`` before generating (:func:`check_output_path`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from hybrid_rl.buffer.sql import _URL_EXAMPLES, DEFAULT_TABLE, NotABufferTable, SQLBuffer, as_sqlalchemy_url
from hybrid_rl.utils.redact import redact_text, redact_url

__all__ = ["SQL_SUFFIXES", "check_output_path", "open_checked"]

SQL_SUFFIXES = (".db", ".sqlite", ".sqlite3")
"""File names taken as a SQLite experience buffer (``--output``)."""
_DRIVER_PACKAGES = {"psycopg": "'psycopg[binary]' (hybrid_rl's postgres extra: pip install -e .[postgres])",
                    "psycopg2": "psycopg2-binary", "pymysql": "pymysql", "mysqldb": "mysqlclient"}


def _reason(error: BaseException, password: Optional[str]) -> str:
    """The database's own words for ``error``, on one line, without the password."""
    orig = getattr(error, "orig", None) or error
    lines = str(orig).splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("LINE ")), len(lines))  # PostgreSQL's SQL echo
    words = " ".join(line.strip() for line in lines[:cut] if line.strip())
    if password:
        words = words.replace(password, "***")
    return redact_text(words) or type(orig).__name__


def _sqlite_folder(url: str, where: str) -> None:
    """The SQLite file's folder exists or can be created, and the file is not a folder."""
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    if os.path.isdir(database):
        raise ValueError(f"{where}: {database} is a folder. Fix: name a file in it, e.g. "
                         f"{os.path.join(database, 'experiences.db')}.")
    folder = os.path.dirname(database)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{where}: cannot create the folder {folder} ({error.strerror}). Fix: point it at a file "
                         "in a folder you can write.") from None


def _connect(url: str, where: str, password: Optional[str]) -> None:
    """Load the dialect and driver and open one connection (PostgreSQL: check the encoding too)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import NoSuchModuleError

    try:
        engine = create_engine(url)
    except NoSuchModuleError:
        raise ValueError(f"{where}: SQLAlchemy knows no database {url.split('://')[0]!r}. Fix: use "
                         "sqlite:///file.db, postgresql+psycopg://user:password@host/db (postgres:// works too) "
                         "or a plain file path.") from None
    except ImportError as error:
        package = _DRIVER_PACKAGES.get((error.name or "").split(".")[0], f"the module {error.name}")
        raise ValueError(f"{where}: the database driver is not installed ({error}). Fix: pip install "
                         f"{package}.") from None
    except Exception as error:  # noqa: BLE001 - ArgumentError & co.: their words may quote the raw URL
        raise ValueError(f"{where}: SQLAlchemy cannot use this URL ({type(error).__name__}). Fix: use e.g. "
                         f"{_URL_EXAMPLES}.") from None
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                encoding = conn.execute(text("SHOW server_encoding")).scalar()
                if encoding != "UTF8":
                    raise ValueError(f"{where}: the database's encoding is {encoding}, which cannot hold every "
                                     "model output (emoji, any script). Fix: use a database created with "
                                     "ENCODING 'UTF8'.")
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the driver raises, it is reported as one line
        raise ValueError(f"{where}: cannot connect ({_reason(error, password)}). Fix: check the user, password, "
                         "host, port and database name in the URL, and that the server runs and accepts this "
                         "user.") from None
    finally:
        engine.dispose()


def _check_writable(buffer: SQLBuffer, where: str, password: Optional[str]) -> None:
    """INSERT, UPDATE and DELETE on the table are allowed (statements that match no row, rolled back)."""
    from sqlalchemy import delete, false, insert, literal, select, update

    t = buffer.table
    try:
        with buffer.engine.connect() as conn, conn.begin() as transaction:
            conn.execute(insert(t).from_select(["status"], select(literal("ready")).where(false())))
            conn.execute(update(t).where(false()).values(status="ready"))
            conn.execute(delete(t).where(false()))
            transaction.rollback()
    except Exception as error:  # noqa: BLE001
        raise ValueError(f"{where}: this user cannot write to table {buffer.name} ({_reason(error, password)}). "
                         "Fix: grant it INSERT, UPDATE and DELETE on the table, or use a database (file) it can "
                         "write.") from None


def open_checked(path: str, name: str = DEFAULT_TABLE, key: str = "async_training.buffer.path") -> SQLBuffer:
    """The :class:`SQLBuffer` of ``path`` and table ``name``, checked (see the module docstring); a
    ``ValueError`` of one line naming ``key`` otherwise."""
    from sqlalchemy.engine import make_url

    where = f"{key} {redact_url(path)!r}" if key.startswith("-") else f"{key}={redact_url(path)!r}"
    try:
        url = as_sqlalchemy_url(path)
    except ValueError as error:
        raise ValueError(f"{key}: {error}") from None
    password = make_url(url).password
    if url.startswith("sqlite"):
        _sqlite_folder(url, where)
    _connect(url, where, password)
    try:
        buffer = SQLBuffer(url, name)
    except NotABufferTable as error:
        raise ValueError(f"{where}: {error}. Fix: choose another table with async_training.buffer.name (or "
                         "another database).") from None
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    except Exception as error:  # noqa: BLE001
        raise ValueError(f"{where}: cannot create or open table {name} ({_reason(error, password)}). Fix: grant "
                         "this user CREATE on the database's schema, or let the table's owner open it once (that "
                         "creates it, or updates a table of an older hybrid_rl: codec and token columns, text "
                         "keys).") from None
    try:
        _check_writable(buffer, where, password)
    except ValueError:
        buffer.close()
        raise
    return buffer


def check_output_path(output: str, key: str = "--output", sql: bool = True) -> None:
    """``output`` can be written: a ``.jsonl`` file in a folder that exists or can be created and is
    writable, or (``sql``) a SQLite file / SQLAlchemy URL that :func:`open_checked` accepts."""
    where = f"{key} {redact_url(output)!r}"
    if os.path.isdir(output):
        raise ValueError(f"{where} is a folder. Fix: name a file, e.g. {os.path.join(output, 'out.jsonl')}.")
    if sql and ("://" in output or output.endswith(SQL_SUFFIXES)):
        open_checked(output, DEFAULT_TABLE, key).close()
        return
    if not output.endswith(".jsonl"):
        kinds = "a .jsonl file, a .db file or a SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...)" if sql \
            else "a .jsonl file"
        raise ValueError(f"{where}: cannot write that kind of file. Fix: write {kinds}.")
    folder = os.path.dirname(os.path.abspath(output))
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"{where}: cannot write in {folder} ({error.strerror}). Fix: choose a folder you can "
                         "write.") from None
