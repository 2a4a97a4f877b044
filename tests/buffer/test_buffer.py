"""Experience buffers: batch round trip, take/release/drop bookkeeping, persistence, concurrent takers."""

import threading

import numpy as np
import pytest
import torch

from hybrid_rl.buffer import (BufferConfig, Experience, MemoryBuffer, SQLBuffer, batch_from_experiences, build_buffer,
                              experiences_from_batch)
from hybrid_rl.buffer.sql import as_sqlalchemy_url
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer

R = 12


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.fixture
def database(request, tmp_path):
    """A SQLite file or a new PostgreSQL database (``request.param``)."""
    return str(tmp_path / "exp.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def buffer(request, tmp_path):
    if request.param == "memory":
        buf = MemoryBuffer()
    else:
        buf = SQLBuffer(str(tmp_path / "exp.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url"))
    yield buf
    buf.close()


def scored_batch(tok) -> DataProto:
    """3 rows as the rollout + reward produce them; row 1 is multi-turn (observation tokens masked)."""
    prompts = [tok("Q1?", add_special_tokens=False)["input_ids"], tok("Question 2?", add_special_tokens=False)["input_ids"],
               tok("Q3", add_special_tokens=False)["input_ids"]]
    responses = [[40, 41, 2], [50, 51, 2, 60, 61, 62, 52, 2], [70]]
    masks = [[1, 1, 1], [1, 1, 1, 0, 0, 0, 1, 1], [1]]
    width = max(map(len, prompts))
    rows = []
    for p, r, m in zip(prompts, responses, masks):
        rows.append(dict(prompt=[0] * (width - len(p)) + p, pmask=[0] * (width - len(p)) + [1] * len(p),
                         resp=r + [0] * (R - len(r)), valid=[1] * len(r) + [0] * (R - len(r)), mask=m + [0] * (R - len(m))))
    t = lambda key: torch.tensor([row[key] for row in rows])  # noqa: E731
    prompt_pos = (t("pmask").cumsum(-1) - 1).clamp(min=0)
    scores = torch.zeros(3, R)
    scores[0, 2], scores[1, 7], scores[2, 0] = 1.0, 0.5, 0.0
    log_probs = torch.where(t("mask").bool(), torch.full((3, R), -0.25), torch.zeros(3, R))
    return DataProto.from_dict(
        {"prompts": t("prompt"), "responses": t("resp"), "response_mask": t("mask"),
         "input_ids": torch.cat([t("prompt"), t("resp")], 1), "attention_mask": torch.cat([t("pmask"), t("valid")], 1),
         "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + torch.arange(1, R + 1)], 1),
         "token_level_scores": scores, "rollout_log_probs": log_probs},
        non_tensors={"uid": np.array(["a", "a", "b"], dtype=object),
                     "data_source": np.array(["arithmetic"] * 3, dtype=object),
                     "reward_model": np.array([{"ground_truth": "7"}] * 3, dtype=object),
                     "num_turns": np.array([2, 4, 2], dtype=object),
                     "extra_info": np.array([{"k": np.int64(1)}, {"obj": object()}, None], dtype=object)})


def test_batch_round_trip_through_the_buffer(buffer, tok):
    batch = scored_batch(tok)
    exps = experiences_from_batch(batch, tok, policy_version=3)
    assert exps[1].response_mask == [1, 1, 1, 0, 0, 0, 1, 1] and exps[1].reward == 0.5
    assert exps[0].prompt_text == "Q1?" and exps[0].extra["extra_info"] == {"k": 1}
    assert exps[1].extra["extra_info"]["obj"].startswith("<object")  # not JSON-able: kept as its repr
    assert buffer.put(exps) == [1, 2, 3]
    back = batch_from_experiences(buffer.take(3, step=1), pad_token_id=0, response_length=R)
    for key in batch.batch.keys():
        assert torch.equal(back.batch[key], batch.batch[key]), key
    assert list(back.non_tensor_batch["uid"]) == ["a", "a", "b"]
    assert list(back.non_tensor_batch["policy_version"]) == [3, 3, 3]
    assert back.non_tensor_batch["reward_model"][0] == {"ground_truth": "7"}


def test_take_release_and_drop_bookkeeping(buffer):
    def exp(version):
        return Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                          reward=0.0, policy_version=version)

    buffer.put([exp(v) for v in (0, 0, 1, 2, 3, 3)])
    assert buffer.drop_stale(version=3, max_staleness=1) == 3  # versions 0, 0, 1 are more than 1 behind 3
    first = buffer.take(2, step=5)
    assert [e.id for e in first] == [4, 5] and {e.status for e in first} == {"taken"}
    assert [e.id for e in buffer.take(5, step=6, min_version=3)] == [6]
    assert buffer.take(5, step=7) == []
    assert (buffer.count("ready"), buffer.count("taken"), buffer.count("dropped"), buffer.count()) == (0, 3, 3, 6)
    # resume from the checkpoint of step 5: step 6's take goes back, step 5's stays trained
    assert buffer.release_after(5) == 1
    assert [e.id for e in buffer.read("ready")] == [6] and [e.taken_step for e in buffer.read("taken")] == [5, 5]
    assert [e.id for e in buffer.read(limit=2)] == [1, 2]
    with pytest.raises(ValueError, match="status='done' is invalid"):
        buffer.count("done")


def test_extra_values_read_one_column(buffer):
    buffer.put([Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                           policy_version=0, extra={"rollout_batch": b} if b else {}) for b in (3, 3, 4, None)])
    buffer.take(2, step=1)
    assert buffer.extra_values("rollout_batch") == [3, 3, 4, None]
    assert buffer.extra_values("rollout_batch", "ready") == [4, None]


def test_memory_buffer_forgets_rows_final_at_a_checkpoint_and_dropped_ones():
    buffer = MemoryBuffer()
    buffer.put([Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                           policy_version=v) for v in (0, 1, 2, 3)])
    buffer.take(1, step=1)  # version 0
    buffer.drop_stale(version=3, max_staleness=1)  # version 1
    buffer.take(1, step=2)  # version 2
    assert buffer.forget_taken(1) == 2  # step 1's row and the dropped one
    assert [(e.policy_version, e.status) for e in buffer.read()] == [(2, "taken"), (3, "ready")]


def test_sql_buffer_survives_the_process_and_is_readable_with_plain_sqlalchemy(tmp_path, tok):
    path = str(tmp_path / "run" / "exp.db")
    writer = SQLBuffer(path)
    writer.put(experiences_from_batch(scored_batch(tok), tok, policy_version=1))
    writer.take(1, step=1)
    writer.close()
    reopened = SQLBuffer(path)  # as after a restart
    assert reopened.count("ready") == 2 and reopened.read("taken")[0].taken_step == 1
    reopened.close()
    import pandas as pd

    table = pd.read_sql_table("experiences", as_sqlalchemy_url(path))
    assert list(table["reward"]) == [1.0, 0.5, 0.0] and list(table["status"]) == ["taken", "ready", "ready"]


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_concurrent_takers_never_share_an_experience(database):
    path = database
    SQLBuffer(path).put([Experience(uid=str(i), data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                                    reward=0.0, policy_version=0) for i in range(60)])
    taken, errors = [], []

    def worker(step):
        buf = SQLBuffer(path)  # its own connection, as another process would have
        try:
            for _ in range(10):
                taken.extend(e.id for e in buf.take(3, step=step))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]  # 3 x 10 x 3 = 90 asks for 60 rows
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(taken) == list(range(1, 61))


def test_a_resume_discards_rows_of_newer_weights(buffer):
    buffer.put([Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                           policy_version=v) for v in (1, 2, 3, 3, 4)])
    buffer.take(1, step=2)  # version 1, trained at step 2
    assert buffer.discard_newer(2) == 3  # versions 3, 3, 4: sampled by weights after the step-2 checkpoint
    assert [(e.policy_version, e.status) for e in buffer.read()] == [(1, "taken"), (2, "ready")]


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_two_runs_share_a_database_in_their_own_tables(database, tmp_path):
    from hybrid_rl.buffer.sql import table_name

    config = BufferConfig(storage_type="sql", path=database)
    runs = {name: build_buffer(config, str(tmp_path / name), experiment_name=name) for name in ("GRPO run-A", "run B")}
    assert {b.name for b in runs.values()} == {"grpo_run_a", "run_b"}
    for index, buf in enumerate(runs.values()):
        buf.put([Experience(uid=str(index), data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
                            reward=float(index), policy_version=0)] * (index + 2))
    a, b = runs.values()
    assert [e.uid for e in a.take(10, step=1)] == ["0", "0"] and b.count("ready") == 3 and a.count() == 2
    named = build_buffer(BufferConfig(storage_type="sql", path=database, name="shared_pool"), str(tmp_path), "x")
    assert named.name == "shared_pool" and named.count() == 0
    assert table_name("2026 Run") == "exp_2026_run"
    with pytest.raises(ValueError, match="is not a table name"):
        SQLBuffer(database, name="Bad-Name")
    for buf in (*runs.values(), named):
        buf.close()


def test_memory_buffer_state_dict_round_trip():
    buf = MemoryBuffer()
    buf.put([Experience(uid="u", data_source="s", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=1.0,
                        policy_version=0)])
    buf.take(1, step=2)
    copy = MemoryBuffer()
    copy.load_state_dict(buf.state_dict())
    assert copy.read() == buf.read() and copy.count("taken") == 1


def test_config_and_urls(tmp_path):
    with pytest.raises(ValueError, match="buffer.storage_type='queue' is invalid"):
        BufferConfig(storage_type="queue")
    assert as_sqlalchemy_url("/a/b.db") == "sqlite:////a/b.db"
    assert as_sqlalchemy_url("sqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(ValueError, match="not a valid SQLAlchemy URL"):
        as_sqlalchemy_url("://nope")
    assert isinstance(build_buffer(BufferConfig(), str(tmp_path)), MemoryBuffer)
    sql = build_buffer(BufferConfig(storage_type="sql"), str(tmp_path / "run"))
    assert sql.url.endswith("run/experiences.db") and (tmp_path / "run" / "experiences.db").exists()
