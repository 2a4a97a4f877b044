"""Token- and turn-level rewards and per-token policy versions through the experience buffer.

A multi-turn row's ``token_level_scores`` (a score at the end of each turn, a tool's per-token
reward) and a partial rollout's ``rollout_versions`` must come back bit for bit from memory, SQLite
and PostgreSQL; a single-turn row stores neither (compact) and rebuilds exactly as before.
"""

import math

import numpy as np
import pytest
import torch
from sqlalchemy import create_engine, text

from hybrid_rl.buffer import Experience, MemoryBuffer, SQLBuffer, batch_from_experiences, experiences_from_batch
from hybrid_rl.buffer.sql import as_sqlalchemy_url
from hybrid_rl.data.layout import prompt_response_tensors
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer

R = 10
TENTH = float(torch.tensor(0.1, dtype=torch.float32))  # a float32 value with no short decimal form
THIRD = float(torch.tensor(1 / 3, dtype=torch.float32))


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def buffer(request, tmp_path):
    if request.param == "memory":
        buf = MemoryBuffer()
    else:
        path = str(tmp_path / "exp.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
        buf = SQLBuffer(path)
    yield buf
    buf.close()


# row 0: multi-turn (model 3, observation 2, model 2): a tool reward on token 1, turn-end scores on 2 and 6,
#        sampled by versions 3, 3, 4 | -, - | 4, 5 (a partial rollout across two weight updates)
# row 1: single-turn, one score on its last token, every token of version 5 (compact: nothing extra stored)
# row 2: single-turn, a -0.0 score on its last token (the sum, +0.0, cannot rebuild the sign)
MASKS = [[1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1], [1, 1]]
SCORES = [{1: TENTH, 2: 0.5, 6: THIRD}, {3: TENTH}, {1: -0.0}]
VERSIONS = [[3, 3, 4, -1, -1, 4, 5], [5, 5, 5, 5], [5, 5]]


def multi_turn_batch(tok, versions: bool = True) -> DataProto:
    prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in ("Q1?", "Question 2?", "Q3")]
    responses = [[40 + j for j in range(len(m))] for m in MASKS]
    tensors = prompt_response_tensors(prompts, responses, MASKS, pad_token_id=0, response_width=R)
    scores = torch.zeros(3, R)  # [B, R]
    for i, row in enumerate(SCORES):
        for j, value in row.items():
            scores[i, j] = value
    tensors["token_level_scores"] = scores
    if versions:
        tagged = torch.full((3, R), -1, dtype=torch.long)  # [B, R], -1 on padding
        for i, row in enumerate(VERSIONS):
            tagged[i, :len(row)] = torch.tensor(row)
        tensors["rollout_versions"] = tagged
    non_tensors = {"uid": np.array(["a", "a", "b"], dtype=object),
                   "reward_model": np.array([{"ground_truth": "7"}] * 3, dtype=object)}
    return DataProto.from_dict(tensors, non_tensors=non_tensors)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).view(torch.int32)


def test_multi_turn_rewards_and_versions_round_trip_bit_exactly(buffer, tok):
    batch = multi_turn_batch(tok)
    exps = experiences_from_batch(batch, tok, policy_version=7)  # the argument yields to rollout_versions
    assert [e.policy_version for e in exps] == [3, 5, 5]  # the oldest version over the model tokens
    assert exps[0].token_rewards == [0.0, TENTH, 0.5, 0.0, 0.0, 0.0, THIRD]
    assert exps[0].reward == float(torch.tensor([TENTH, 0.5, THIRD]).sum())  # the scalar stays, for queries
    assert exps[0].token_versions == VERSIONS[0]
    assert exps[1].token_rewards is None and exps[1].token_versions is None  # compact
    assert exps[2].token_rewards is not None and math.copysign(1, exps[2].token_rewards[1]) == -1
    buffer.put(exps)
    taken = buffer.take(3, step=1)
    assert [e.token_versions for e in taken] == [VERSIONS[0], None, None]
    width = batch.batch["prompts"].shape[1]
    back = batch_from_experiences(taken, pad_token_id=0, response_length=R, prompt_length=width)
    assert torch.equal(bits(back.batch["token_level_scores"]), bits(batch.batch["token_level_scores"]))
    assert torch.equal(back.batch["rollout_versions"], batch.batch["rollout_versions"])
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids", "position_ids"):
        assert torch.equal(back.batch[key], batch.batch[key]), key
    nt = back.non_tensor_batch
    assert list(nt["policy_version"]) == [3, 5, 5]
    assert list(nt["min_global_steps"]) == [3, 5, 5] and list(nt["max_global_steps"]) == [5, 5, 5]


def test_single_turn_rows_store_nothing_extra_and_rebuild_as_before(buffer, tok):
    batch = multi_turn_batch(tok, versions=False)
    batch.batch["token_level_scores"][0] = 0.0
    batch.batch["token_level_scores"][0, 6] = 2.0  # row 0 now: one score on its last model token
    batch.batch["token_level_scores"][2, 1] = 1.0
    exps = experiences_from_batch(batch, tok, policy_version=4)
    assert all(e.token_rewards is None and e.token_versions is None for e in exps)
    assert [e.policy_version for e in exps] == [4, 4, 4]
    buffer.put(exps)
    back = batch_from_experiences(buffer.take(3, step=1), pad_token_id=0, response_length=R)
    assert "rollout_versions" not in back.batch.keys()  # no row has per-token versions
    expected = torch.zeros(3, R)
    expected[0, 6], expected[1, 3], expected[2, 1] = 2.0, TENTH, 1.0  # the reward on the last model token
    assert torch.equal(bits(back.batch["token_level_scores"]), bits(expected))
    assert list(back.non_tensor_batch["min_global_steps"]) == [4, 4, 4]
    assert list(back.non_tensor_batch["max_global_steps"]) == [4, 4, 4]


def test_a_batch_mixing_rows_with_and_without_versions():
    """A row without token_versions gets its policy_version on model tokens and -1 elsewhere."""
    plain = Experience(uid="p", data_source="", prompt_ids=[1], response_ids=[2, 3, 4], response_mask=[1, 0, 1],
                       reward=1.0, policy_version=6)
    tagged = Experience(uid="t", data_source="", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
                        reward=0.0, policy_version=2, token_versions=[2, 8])
    back = batch_from_experiences([plain, tagged], pad_token_id=0, response_length=4)
    assert back.batch["rollout_versions"].tolist() == [[6, -1, 6, -1], [2, 8, -1, -1]]
    assert back.batch["rollout_versions"].dtype == torch.int64
    assert list(back.non_tensor_batch["min_global_steps"]) == [6, 2]
    assert list(back.non_tensor_batch["max_global_steps"]) == [6, 8]


def test_memory_state_dict_round_trip_and_an_older_state(tok):
    buf = MemoryBuffer()
    buf.put(experiences_from_batch(multi_turn_batch(tok), tok, policy_version=7))
    state = buf.state_dict()
    again = MemoryBuffer()
    again.load_state_dict(state)
    assert [e.to_dict() for e in again.read()] == [e.to_dict() for e in buf.read()]
    for d in state["experiences"]:  # a checkpoint written before the fields existed
        del d["token_rewards"], d["token_versions"]
    again.load_state_dict(state)
    assert all(e.token_rewards is None and e.token_versions is None for e in again.read())


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_table_without_the_token_columns_is_migrated_and_reads_none(database, tmp_path, request):
    path = str(tmp_path / "exp.db") if database == "sqlite" else request.getfixturevalue("postgres_url")
    SQLBuffer(path).close()
    engine = create_engine(as_sqlalchemy_url(path))
    with engine.begin() as conn:  # the table as the previous version left it
        conn.execute(text("ALTER TABLE experiences DROP COLUMN token_rewards"))
        conn.execute(text("ALTER TABLE experiences DROP COLUMN token_versions"))
        conn.execute(text(
            "INSERT INTO experiences (uid, data_source, prompt_text, response_text, prompt_ids, response_ids, "
            "response_mask, reward, policy_version, extra, created_at, status, codec) VALUES ('old', 's', 'p', 'r', "
            "'[1]', '[2, 3]', '[1, 1]', 0.5, 1, '{}', 1.0, 'ready', 1)"))
    engine.dispose()
    buffer = SQLBuffer(path)  # adds the columns
    buffer.put([Experience(uid="new", data_source="s", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
                           reward=0.5, policy_version=2, token_rewards=[0.25, 0.25], token_versions=[1, 2])])
    old, new = buffer.read()
    assert (old.token_rewards, old.token_versions, old.reward) == (None, None, 0.5)
    assert (new.token_rewards, new.token_versions) == ([0.25, 0.25], [1, 2])
    back = batch_from_experiences([old], pad_token_id=0, response_length=2)
    assert back.batch["token_level_scores"].tolist() == [[0.0, 0.5]]
    buffer.close()


@pytest.mark.parametrize("name", ["token_rewards", "token_versions"])
def test_a_per_token_list_of_the_wrong_length_is_refused(name):
    row = Experience(uid="u7", data_source="", prompt_ids=[1], response_ids=[2, 3, 4], response_mask=[1, 1, 1],
                     reward=1.0, policy_version=0, id=7, **{name: [0, 0]})
    message = (f"experience 7 (uid 'u7'): {name} has 2 values for 3 response tokens. Fix: give one value per "
               "response_ids token (observations included), or None.")
    buf = MemoryBuffer()
    with pytest.raises(ValueError) as error:
        buf.put([row])
    assert str(error.value) == message and buf.count() == 0  # nothing stored
    with pytest.raises(ValueError, match="has 2 values for 3 response tokens"):
        batch_from_experiences([row], pad_token_id=0, response_length=4)


def test_sql_put_refuses_a_wrong_length_before_writing(tmp_path):
    buffer = SQLBuffer(str(tmp_path / "exp.db"))
    good = Experience(uid="g", data_source="", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                      policy_version=0)
    bad = Experience(uid="b", data_source="", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                     policy_version=0, token_versions=[0, 0])
    with pytest.raises(ValueError, match=r"^an experience not yet stored \(uid 'b'\): token_versions has 2 values"):
        buffer.put([good, bad])
    assert buffer.count() == 0
    buffer.close()


def test_a_model_token_without_a_version_is_refused(tok):
    batch = multi_turn_batch(tok)
    batch.batch["rollout_versions"][1, 2] = -1
    with pytest.raises(ValueError) as error:
        experiences_from_batch(batch, tok, policy_version=7)
    assert str(error.value) == ("rollout_versions row 1: a model token (response_mask 1) carries version -1. Fix: tag "
                                "each sampled token with the policy version that sampled it (>= 0); -1 belongs on "
                                "observations and padding only.")
