"""A throwaway PostgreSQL server for tests and benchmarks (the buffer's server-database checks).

:func:`start_postgres` runs Debian's ``initdb`` and ``pg_ctl`` (as the ``postgres`` user when this
process is root, which initdb refuses to be) on a fresh data folder, listening only on a Unix socket
in that folder, UTF-8; the ``postgres`` superuser is trust-authenticated, other roles
(:meth:`PostgresServer.create_user`) by password. :meth:`PostgresServer.stop` stops it and removes
the folder.
:func:`postgres_unavailable` says why no server can be started here (no binaries, no driver).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional

__all__ = ["PostgresServer", "postgres_unavailable", "start_postgres"]

PORT = 5433


def _bin_dir() -> Optional[str]:
    on_path = shutil.which("initdb")
    if on_path:
        return os.path.dirname(os.path.realpath(on_path))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def postgres_unavailable() -> Optional[str]:
    """Why :func:`start_postgres` cannot work here; None when it can."""
    if _bin_dir() is None:
        return "no PostgreSQL server binaries (initdb): bash scripts/install.sh --test installs Debian's postgresql"
    if importlib.util.find_spec("psycopg") is None:
        return "no PostgreSQL driver: pip install 'psycopg[binary]' (hybrid_rl's postgres extra)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


@dataclass
class PostgresServer:
    """A running server: ``url`` is its SQLAlchemy URL (database ``postgres``)."""

    folder: str
    bin_dir: str
    url: str

    def create_database(self, name: str) -> str:
        """A new empty database on this server; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(host=self.folder, port=PORT, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.replace("/postgres?", f"/{name}?")

    def create_user(self, name: str, password: str, database: str = "postgres") -> str:
        """A new login role that authenticates by ``password`` (SCRAM); returns its SQLAlchemy URL of
        ``database``. It has the rights PUBLIC has (PostgreSQL 15: no CREATE on schema public)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(host=self.folder, port=PORT, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
        return f"postgresql+psycopg://{name}:{password}@/{database}?host={self.folder}&port={PORT}"

    def execute(self, statement: str, database: str = "postgres") -> None:
        """Run one SQL statement as the superuser (grants, revokes) in ``database``."""
        import psycopg

        with psycopg.connect(host=self.folder, port=PORT, user="postgres", dbname=database, autocommit=True) as conn:
            conn.execute(statement)

    def stop(self) -> None:
        _run([os.path.join(self.bin_dir, "pg_ctl"), "-D", os.path.join(self.folder, "data"), "-m", "immediate",
              "-w", "stop"], check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)


def start_postgres() -> PostgresServer:
    """Start a server on a new data folder (a few seconds); raises RuntimeError with its log otherwise."""
    problem = postgres_unavailable()
    if problem:
        raise RuntimeError(problem)
    bin_dir = _bin_dir()
    folder = tempfile.mkdtemp(prefix="hybrid_rl_pg_")
    os.chmod(folder, 0o777)
    if os.geteuid() == 0:
        shutil.chown(folder, user="postgres")
    data = os.path.join(folder, "data")
    try:
        _run([os.path.join(bin_dir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync",
              "--encoding=UTF8", "--locale=C"])
        with open(os.path.join(data, "pg_hba.conf"), "w") as hba:  # the superuser as before; others by password
            hba.write("local all postgres trust\nlocal all all scram-sha-256\n")
        options = f"-k {folder} -p {PORT} -c listen_addresses='' -c fsync=off -c max_connections=50"
        _run([os.path.join(bin_dir, "pg_ctl"), "-D", data, "-o", options, "-l", os.path.join(folder, "log"),
              "-w", "start"])
    except subprocess.CalledProcessError as error:
        log = open(os.path.join(folder, "log")).read()[-2000:] if os.path.exists(os.path.join(folder, "log")) else ""
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {error.stderr or error.stdout}{log}") from None
    return PostgresServer(folder, bin_dir, f"postgresql+psycopg://postgres@/postgres?host={folder}&port={PORT}")
