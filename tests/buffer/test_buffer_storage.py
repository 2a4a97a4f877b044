"""The SQL buffer stores what it is given, on SQLite and PostgreSQL: NUL, NaN, infinities, any Unicode;
tables of an older version still read; four processes may create one table at once; postgres:// URLs."""

import math
import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, text

from hybrid_rl.buffer import Experience, SQLBuffer
from hybrid_rl.buffer.codec import decode_json, decode_text, encode_json, encode_text
from hybrid_rl.buffer.sql import as_sqlalchemy_url

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUL = "\x00"  # SmolLM2's token 190 decodes to it
EMOJI = "\U0001F600"  # outside the Basic Multilingual Plane (a surrogate pair in UTF-16)


@pytest.fixture
def database(request, tmp_path):
    """A SQLite file or a new PostgreSQL database (``request.param``)."""
    return str(tmp_path / "exp.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def awkward_experiences():
    """Rows holding what databases refuse or change, one kind per row (and all at once in the first)."""
    everything = Experience(
        uid=f"u{NUL}1", data_source=f"src {EMOJI}", prompt_ids=[1, 2], response_ids=[190, 3], response_mask=[1, 1],
        reward=math.nan, policy_version=2, rollout_log_probs=[-math.inf, -0.5],
        prompt_text=f"a{NUL}b \ue000 \ue0000 {EMOJI}", response_text=f"{NUL}{NUL}\ud800",
        ground_truth={"$float": "nan"},  # a user's dict that looks like the tag
        extra={"scores": [math.inf, -math.inf, math.nan, 1.5], f"k{NUL}": {"$dict": [NUL]}, "t": (1, "x")})
    rewards = [math.inf, -math.inf, 0.25]
    texts = [NUL, EMOJI, "plain"]
    return [everything] + [Experience(uid=str(i), data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                                      reward=r, policy_version=0, response_text=t)
                           for i, (r, t) in enumerate(zip(rewards, texts))]


def comparable(e):
    """An experience's stored fields as text: NaN == NaN, -0.0 != 0.0, tuples read back as lists."""
    d = e.to_dict()
    for key in ("id", "status", "taken_step"):
        d.pop(key)
    d["extra"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["extra"].items()}
    return repr(d)


def test_codec_round_trips_and_leaves_ordinary_values_alone():
    assert encode_text("plain text, \\ and $float") == "plain text, \\ and $float"
    assert encode_text(f"a{NUL}b\ue000c\udfff") == "a\ue0000b\ue000ec\ue000udfff"
    assert decode_text("a\ue0000b\ue000ec\ue000udfff") == f"a{NUL}b\ue000c\udfff"
    assert encode_json([1, 2.5, -3]) == [1, 2.5, -3]
    assert encode_json({"x": [math.nan, math.inf, -math.inf]}) == {"x": [{"$float": "nan"}, {"$float": "inf"},
                                                                         {"$float": "-inf"}]}
    assert encode_json({"$float": "inf"}) == {"$dict": {"$float": "inf"}}  # never read back as a number
    assert decode_json(encode_json({"$float": "inf"})) == {"$float": "inf"}
    value = {"a": [1, {"b": math.inf}], NUL: {"$dict": 1}}
    assert decode_json(encode_json(value)) == value


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_nul_nan_infinities_and_emoji_round_trip(database):
    buffer = SQLBuffer(database)
    given = awkward_experiences()
    assert buffer.put(given) == [1, 2, 3, 4]
    taken = buffer.take(4, step=1)
    assert [comparable(e) for e in taken] == [comparable(e) for e in given]
    assert math.isnan(taken[0].reward) and taken[1].reward == math.inf and taken[2].reward == -math.inf
    assert buffer.extra_values("scores")[0][2] != buffer.extra_values("scores")[0][2]  # NaN, not None
    assert [e.response_text for e in buffer.read()] == [given[0].response_text, NUL, EMOJI, "plain"]
    # The reward stays a plain, queryable float column; text without NUL stays as it was written.
    with create_engine(as_sqlalchemy_url(database)).connect() as conn:
        assert conn.execute(text("SELECT id FROM experiences WHERE reward < 1 ORDER BY id")).scalars().all() == [3, 4]
        assert conn.execute(text("SELECT response_text FROM experiences WHERE id = 3")).scalar() == EMOJI
    buffer.close()


def _row(**fields):
    return Experience(**{**dict(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                                reward=1.0, policy_version=0), **fields})


SCALARS = [1.0, -0.0, 2**63 + 1, 10**30, "1e5", [1.0, 2**64], None]
"""Scalar ground truths SQLite's NUMERIC affinity changed (1.0 -> 1, -0.0 -> 0, 2**63+1 and 10**30 -> floats)."""


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_long_keys_and_scalar_json_round_trip(database):
    """uid and data_source of any length (PostgreSQL's varchar(256) refused 300 characters, and a NUL
    doubles in the codec's escape); JSON scalars come back with their type and sign (repr compares)."""
    buffer = SQLBuffer(database)
    given = [_row(data_source="d" * 1000), _row(uid=NUL * 200, data_source=NUL * 200)]
    given += [_row(uid=f"gt{i}", ground_truth=value, extra={"v": value}) for i, value in enumerate(SCALARS)]
    buffer.put(given)
    taken = buffer.take(len(given), step=1)
    assert [repr((e.uid, e.data_source, e.ground_truth, e.extra)) for e in taken] == \
        [repr((e.uid, e.data_source, e.ground_truth, e.extra)) for e in given]
    buffer.close()


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_a_negative_zero_reward_reads_back_equal(database):
    """``reward`` stays a float column: PostgreSQL keeps -0.0; SQLite stores an integral REAL as an
    integer, so -0.0 reads back 0.0 (equal to it; only the sign bit is lost, documented)."""
    buffer = SQLBuffer(database)
    buffer.put([_row(reward=-0.0)])
    (reward,) = [e.reward for e in buffer.read()]
    assert reward == 0.0 and math.copysign(1.0, reward) == (1.0 if database.endswith(".db") else -1.0)
    buffer.close()


def test_a_sqlite_table_with_json_columns_still_reads(tmp_path):
    """A table created before JSONText declared its JSON columns ``JSON`` (NUMERIC affinity): it opens,
    takes new rows and reads them; arrays and strings exactly, a scalar number as the number SQLite kept."""
    database = str(tmp_path / "old.db")
    SQLBuffer(database).close()
    with create_engine(as_sqlalchemy_url(database)).begin() as conn:
        conn.execute(text("ALTER TABLE experiences RENAME COLUMN ground_truth TO gt_text"))
        conn.execute(text("ALTER TABLE experiences ADD COLUMN ground_truth JSON"))
        conn.execute(text("ALTER TABLE experiences DROP COLUMN gt_text"))
    buffer = SQLBuffer(database)
    buffer.put([_row(ground_truth=[1.0, "x"]), _row(ground_truth="4"), _row(ground_truth=2.0)])
    assert [e.ground_truth for e in buffer.read()] == [[1.0, "x"], "4", 2]
    buffer.close()


def test_postgres_widens_the_varchar_keys_of_an_older_table(postgres_url):
    SQLBuffer(postgres_url).close()
    engine = create_engine(postgres_url)
    with engine.begin() as conn:  # as the previous version created them
        conn.execute(text("ALTER TABLE experiences ALTER COLUMN uid TYPE varchar(256), "
                          "ALTER COLUMN data_source TYPE varchar(256)"))
    buffer = SQLBuffer(postgres_url)
    buffer.put([_row(uid="u" * 300, data_source=NUL * 200)])
    assert [(e.uid, e.data_source) for e in buffer.read()] == [("u" * 300, NUL * 200)]
    buffer.close()
    with engine.connect() as conn:
        types = conn.execute(text("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = "
                                  "'experiences' AND column_name IN ('uid', 'data_source') ORDER BY 1")).all()
    engine.dispose()
    assert [tuple(t) for t in types] == [("data_source", "text"), ("uid", "text")]


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_a_table_written_before_the_codec_still_reads(database):
    url = as_sqlalchemy_url(database)
    SQLBuffer(database).close()
    engine = create_engine(url)
    with engine.begin() as conn:  # the table as the previous version left it: no codec column, raw values
        conn.execute(text("ALTER TABLE experiences DROP COLUMN codec"))
        conn.execute(text(
            "INSERT INTO experiences (uid, data_source, prompt_text, response_text, prompt_ids, response_ids, "
            "response_mask, reward, policy_version, extra, created_at, status) VALUES ('old', 's', 'p', "
            ":response, '[1]', '[2]', '[1]', NULL, 0, '{\"k\": \"\ue0000\"}', 1.0, 'ready')"),
            {"response": "kept \ue0000 as written"})
    engine.dispose()
    buffer = SQLBuffer(database)  # adds the codec column
    buffer.put([Experience(uid="new", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                           reward=1.0, policy_version=0, response_text=NUL)])
    old, new = buffer.read()
    assert old.response_text == "kept \ue0000 as written" and old.extra == {"k": "\ue0000"}  # not decoded
    assert math.isnan(old.reward)  # SQLite's NULL for the NaN the old version wrote
    assert new.response_text == NUL and buffer.extra_values("k") == ["\ue0000", None]
    buffer.close()


CREATOR = """
import os, sys, time
from hybrid_rl.buffer import SQLBuffer
url, go, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
print("ready", flush=True)
for name in names:
    while not os.path.exists(go + name):
        time.sleep(0.0005)
    SQLBuffer(url, name).close()
"""


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_four_processes_create_the_same_new_table_at_once(database, tmp_path):
    names = [f"pool_{i}" for i in range(4)]  # four races: before the lock, 1 in 3 lost one on PostgreSQL
    go = str(tmp_path / "go_")
    creators = [subprocess.Popen([sys.executable, "-c", CREATOR, database, go, ",".join(names)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        for creator in creators:  # all imported and waiting: the creations start within a millisecond
            assert creator.stdout.readline().strip() == "ready", creator.stderr.read()
        for name in names:
            open(go + name, "w").close()
        results = [creator.communicate(timeout=300) for creator in creators]
    finally:
        for creator in creators:
            creator.kill()
    assert [c.returncode for c in creators] == [0] * 4, [err[-2000:] for _, err in results]
    for name in names:
        buffer = SQLBuffer(database, name)
        assert buffer.put([Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                                      reward=0.0, policy_version=0)]) == [1]
        buffer.close()


def test_postgres_urls_name_the_installed_driver():
    assert as_sqlalchemy_url("postgres://me:pw@db:5432/rl") == "postgresql+psycopg://me:pw@db:5432/rl"
    assert as_sqlalchemy_url("postgresql://me@db/rl?sslmode=require") == "postgresql+psycopg://me@db/rl?sslmode=require"
    assert as_sqlalchemy_url("postgresql+psycopg2://me@db/rl") == "postgresql+psycopg2://me@db/rl"  # as chosen
    with pytest.raises(ValueError, match="not a valid SQLAlchemy URL") as error:
        as_sqlalchemy_url("://me:SECRET@db")
    assert "SECRET" not in str(error.value)


def test_postgres_spellings_open_a_real_server(postgres_url):
    for scheme, name in (("postgres", "a"), ("postgresql", "b")):
        buffer = SQLBuffer(postgres_url.replace("postgresql+psycopg", scheme), name)
        assert buffer.put(awkward_experiences()[:1]) == [1] and buffer.read()[0].prompt_text.startswith(f"a{NUL}b")
        buffer.close()
