"""A buffer's database is checked before anything runs: one line naming the key and the fix, the
password hidden; main_ppo ends with it before Ray starts, debug rollout before generating."""

import os
import sqlite3
import subprocess
import sys

import pytest

from hybrid_rl.buffer.check import check_output_path, open_checked

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "S3cretPw"
UNREACHABLE = f"postgresql+psycopg://me:{SECRET}@127.0.0.1:1/rl"  # port 1: nothing listens


def one_line_error(call) -> str:
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and SECRET not in message and "Fix:" in message
    return message


def test_unreachable_or_unknown_databases_are_one_line():
    message = one_line_error(lambda: open_checked(UNREACHABLE))
    assert message.startswith("async_training.buffer.path='postgresql+psycopg://me:***@127.0.0.1:1/rl': cannot "
                              "connect (connection failed:") and "Connection refused" in message
    assert "postgres://me:***@127.0.0.1:1/rl" in one_line_error(lambda: open_checked(UNREACHABLE.replace(
        "postgresql+psycopg", "postgres")))  # the spelling is accepted: the connection is what fails
    assert "SQLAlchemy knows no database 'nosuch'" in one_line_error(lambda: open_checked("nosuch://me:S3cretPw@h/x"))
    assert "the database driver is not installed (No module named 'pymysql'). Fix: pip install pymysql" in \
        one_line_error(lambda: open_checked("mysql+pymysql://me:S3cretPw@h/x"))


@pytest.mark.parametrize("url, fragment", [
    # SQLAlchemy splits at the first '@': the password's tail would be the host, repeated by psycopg
    (f"postgresql+psycopg://me:{SECRET}@X@127.0.0.1:1/rl", "'postgresql+psycopg://me:***@127.0.0.1:1/rl': its host "
     "holds an '@'. Fix: percent-encode '@' in the password as %40."),
    (f"sqlite://me:{SECRET}@/tmp/x.db", "'sqlite://me:***@/tmp/x.db': a SQLite URL names a file, with no user, "
     "password or host. Fix: use sqlite:///relative/file.db"),
    # no '@': make_url takes the password for a port and its error quotes it
    (f"postgresql+psycopg://me:{SECRET}", "'postgresql+psycopg://me:***' is not a valid SQLAlchemy URL (after the "
     "host, ':' takes a port number; a password is written user:password@host)"),
    (f"postgresql+psycopg://me:{SECRET}@[::1/rl", "'postgresql+psycopg://me:***@[::1/rl' is not a valid SQLAlchemy"),
])
def test_urls_that_do_not_parse_are_one_line_without_the_password(url, fragment):
    message = one_line_error(lambda: open_checked(url))
    assert message.startswith("async_training.buffer.path: ") and fragment in message, message
    assert "int()" not in message


def test_sqlite_files_that_cannot_be_a_buffer(tmp_path):
    assert "is a folder. Fix: name a file in it" in one_line_error(lambda: open_checked(str(tmp_path)))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert f"cannot create the folder {blocker}" in one_line_error(lambda: open_checked(str(blocker / "sub" / "x.db")))
    open_checked(str(tmp_path / "ro.db")).close()
    read_only = f"sqlite:///file:{tmp_path}/ro.db?mode=ro&uri=true"
    assert "this user cannot write to table experiences (attempt to write a readonly database)" in \
        one_line_error(lambda: open_checked(read_only))
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE experiences (a INTEGER)")
    assert "table 'experiences' exists but is not an experience buffer: it lacks the columns" in \
        one_line_error(lambda: open_checked(str(tmp_path / "other.db")))
    assert open_checked(str(tmp_path / "other.db"), "mine").count() == 0  # another table of that file is fine


def test_postgres_wrong_password_and_missing_rights(postgres_server, postgres_url):
    database = postgres_url.split("?")[0].rsplit("/", 1)[1]
    user = postgres_server.create_user("alice", SECRET, database)
    assert "password authentication failed for user \"alice\"" in one_line_error(
        lambda: open_checked(user.replace(SECRET, "wrong" + SECRET)))
    assert "cannot create or open table experiences (permission denied for schema public)" in \
        one_line_error(lambda: open_checked(user))  # PostgreSQL 15: PUBLIC has no CREATE on schema public
    open_checked(postgres_url, "pool").close()  # the owner creates it; alice may only read
    postgres_server.execute("GRANT SELECT ON pool TO alice", database)
    assert "this user cannot write to table pool (permission denied for table pool)" in \
        one_line_error(lambda: open_checked(user, "pool"))
    postgres_server.execute("GRANT INSERT, UPDATE, DELETE ON pool TO alice", database)
    open_checked(user, "pool").close()


def test_output_paths(tmp_path):
    assert "--output 'x.txt': cannot write that kind of file. Fix: write a .jsonl file, a .db file or a SQLAlchemy" \
        in one_line_error(lambda: check_output_path("x.txt"))
    assert "Fix: write a .jsonl file." in one_line_error(lambda: check_output_path("x.db", sql=False))
    assert "is a folder" in one_line_error(lambda: check_output_path(str(tmp_path)))
    (tmp_path / "file").write_text("")
    assert "cannot write in" in one_line_error(lambda: check_output_path(str(tmp_path / "file" / "o.jsonl")))
    check_output_path(str(tmp_path / "new" / "o.jsonl"))
    check_output_path(str(tmp_path / "o.db"))
    assert (tmp_path / "new").is_dir() and (tmp_path / "o.db").exists()


def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": REPO})


def _assert_one_line(result, *fragments):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith("hybrid_rl config error: ") and all(f in lines[-1] for f in fragments), lines[-1]
    assert "Traceback" not in result.stderr and SECRET not in result.stdout + result.stderr


def test_main_ppo_ends_with_one_line_before_ray_starts(tmp_path, tiny_model_dir):
    from tests.trainer.test_e2e import _overrides

    result = _run(["hybrid_rl.trainer.main_ppo", *_overrides(
        tmp_path, tiny_model_dir, "trainer.n_gpus_per_node=1", "async_training.enable=true",
        "rollout.n_gpus_per_node=1",
        "async_training.max_head_offpolicyness=0", "async_training.buffer.storage_type=sql",
        "actor_rollout_ref.rollout.calculate_log_probs=true", f"async_training.buffer.path='{UNREACHABLE}'")], tmp_path)
    _assert_one_line(result, "async_training.buffer.path='postgresql+psycopg://me:***@127.0.0.1:1/rl': cannot connect")
    assert "Ray" not in result.stdout + result.stderr  # no cluster was started, no worker ran


def test_debug_rollout_refuses_a_bad_output_before_generating(tmp_path):
    # The model path does not exist: had anything been loaded or generated, that would be the error.
    model = "actor_rollout_ref.model.path=/nonexistent/model"
    for output, fragment in (("x.txt", "--output 'x.txt': cannot write that kind of file"),
                             (UNREACHABLE, "--output 'postgresql+psycopg://me:***@127.0.0.1:1/rl': cannot connect"),
                             (f"sqlite://me:{SECRET}@/x.db", "--output: 'sqlite://me:***@/x.db': a SQLite URL names a "
                              "file, with no user")):
        result = _run(["hybrid_rl.debug", "rollout", "--output", output, model], tmp_path)
        _assert_one_line(result, fragment)
        assert "experiences written" not in result.stdout and "prompt -> response" not in result.stdout
