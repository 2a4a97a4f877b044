"""The streaming producer (partial rollout) without Ray: a fake engine that samples one token per pump,
keeps in-flight requests across weight loads and tags each token with the version that sampled it."""

import threading
import time

import numpy as np
import pytest
import torch

from hybrid_rl.buffer import MemoryBuffer, batch_from_experiences
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation
from hybrid_rl.trainer.ppo.producer import ProducerState
from hybrid_rl.trainer.ppo.stream_groups import assemble_group, split_groups
from hybrid_rl.trainer.ppo.stream_producer import StreamingProducer, may_start_group
from hybrid_rl.workers.rollout.params import GenerationParams

G, N, R = 2, 2, 8  # groups (prompts) per batch, rows per group, response budget
ROWS = G * N
EOS = 99


class Loader:
    """Prompt batches ``[G, 3]`` whose tokens say the batch position; epochs of 6 batches."""

    def __init__(self, position=0):
        self.position = position

    def __iter__(self):
        while True:
            self.position += 1
            ids = torch.tensor([[0, self.position, g] for g in range(G)])
            yield {"input_ids": ids, "attention_mask": torch.tensor([[0, 1, 1]] * G),
                   "position_ids": torch.tensor([[0, 0, 1]] * G),
                   "pos": np.array([self.position] * G, dtype=object)}
            if self.position % 6 == 0:
                return

    def state_dict(self):
        return {"position": self.position}


class Tok:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class FakeEngine:
    """One token per request per pump; request (batch b, group g) answers ``length(b, g)`` tokens then EOS.
    The token's log-prob is ``-(version + 1) / 10``, so a test can tell which weights sampled it."""

    def __init__(self, length):
        self.length, self.version, self.live, self.lock = length, None, {}, threading.Lock()
        self.loads: list[int] = []

    def submit(self, requests):
        with self.lock:
            for r in requests:
                self.live[r["request_id"]] = {"request_id": r["request_id"], "response_ids": [], "log_probs": [],
                                              "versions": [], "max_tokens": r["max_tokens"]}

    def step(self, max_wall_s):
        time.sleep(0.002)
        finished = []
        with self.lock:
            for rid, s in list(self.live.items()):
                b, g, _ = (int(x) for x in rid.split(":"))
                done = len(s["response_ids"]) + 1 >= min(self.length(b, g), s["max_tokens"])
                s["response_ids"].append(EOS if done else 7)
                s["log_probs"].append(-(self.version + 1) / 10)
                s["versions"].append(self.version)
                if done:
                    finished.append({**s, "finish_reason": "stop"})
                    del self.live[rid]
        return finished

    def load(self, weights, version):
        with self.lock:  # in-flight requests keep their tokens: partial rollout
            self.version = version
            self.loads.append(version)
        return {"timing_s/weight_load": 0.0}


def split(batch_dict, index):
    batch = generation.prepare_rollout_batch(DataProto.from_single_dict(batch_dict), N, index)
    return split_groups(batch, N, index)


def params():
    return GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=None, eos_token_ids=(EOS,),
                            pad_token_id=0, response_length=R)


def make(buffer, eta, engine, state=None, taken=0, buffered=frozenset(), ready_groups=None):
    def score(batch, metrics):
        batch.batch["token_level_scores"] = torch.zeros(len(batch), R)
        return batch

    producer = StreamingProducer(
        loader=Loader(), state=state or ProducerState(1, {"position": 0}), score=score, load_weights=engine.load,
        buffer=buffer, tokenizer=Tok(), eta=eta, taken_batches=taken, ready_batches=0, split=split,
        submit=engine.submit, step=engine.step, assemble=lambda group: assemble_group(group, params(), True),
        groups_per_batch=G, buffered_groups=buffered, ready_groups=ready_groups, step_wall_s=0.01)
    producer.max_tokens = R
    return producer


def train(producer, buffer, steps, eta):
    taken = []
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        for step in range(1, steps + 1):
            deadline = time.time() + 120
            while True:  # as DecoupledPPOTrainer.take_experiences: drop, wait, drop what streamed in, take
                dropped = buffer.drop_stale(step - 1, eta)
                if dropped:
                    producer.dropped_rows(dropped, N)
                if buffer.count("ready") >= ROWS:
                    break
                producer.check()
                assert time.time() < deadline, "the streaming producer stalled"
                time.sleep(0.002)
            taken.append(buffer.take(ROWS, step, min_version=step - 1 - eta))
            producer.consumed(1)
            time.sleep(0.01)
            producer.offer_weights(f"w{step}", step)
    finally:
        producer.stop()
    return taken


@pytest.mark.parametrize("taken,ready,running,version,eta,expected", [
    (0, 0, 0, None, 1, False), (0, 0, 1, 0, 0, True), (0, 1, 1, 0, 0, False),  # eta 0: one batch of G groups
    (2, 0, 0, 1, 0, True), (2, 1, 0, 0, 0, False), (0, 3, 0, 0, 1, True), (0, 3, 1, 0, 1, False)])
def test_may_start_group_is_arealS_capacity_in_groups(taken, ready, running, version, eta, expected):
    assert may_start_group(taken, ready, running, version, eta, groups_per_batch=G) is expected


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_every_token_keeps_the_version_and_log_prob_that_sampled_it(eta):
    engine = FakeEngine(length=lambda b, g: 2 + 5 * ((b + g) % 3 == 0))  # a long tail: some groups 7 tokens
    buffer = MemoryBuffer()
    taken = train(make(buffer, eta, engine), buffer, steps=6, eta=eta)
    seen = set()
    for step, rows in enumerate(taken, start=1):
        assert len(rows) == ROWS
        batch = batch_from_experiences(rows, 0, R)
        log_probs, mask = batch.batch["rollout_log_probs"], batch.batch["response_mask"]
        if "rollout_versions" in batch.batch.keys():
            versions = batch.batch["rollout_versions"]
        else:  # every row sampled by one version (stored compactly): its policy_version on each token
            versions = torch.tensor([[e.policy_version] * R for e in rows]) * mask
        assert torch.equal(log_probs[mask.bool()], -(versions[mask.bool()].float() + 1) / 10)
        firsts: dict = {}
        for i, e in enumerate(rows):
            row_versions = versions[i][mask[i].bool()].tolist()
            assert row_versions == sorted(row_versions)  # a later token never by older weights
            firsts.setdefault(e.uid, []).append((e.policy_version, row_versions[0]))
            assert (step - 1) - e.policy_version <= eta  # the staleness bound, on the oldest token
        for group in firsts.values():  # every row of a group: the group's oldest first token
            assert {v for v, _ in group} == {min(first for _, first in group)}
        groups = {(e.extra["rollout_batch"], e.extra["rollout_group"]) for e in rows}
        assert len(groups) == G and not groups & seen  # whole groups, each trained once
        seen |= groups
    assert engine.loads[:2] == [0, 1]


def test_short_groups_are_not_held_back_by_a_long_one():
    engine = FakeEngine(length=lambda b, g: 8 if (b, g) == (1, 0) else 2)
    buffer = MemoryBuffer()
    producer = make(buffer, 1, engine)
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        deadline = time.time() + 60
        while not any(e.extra["rollout_batch"] == 2 for e in buffer.read()):
            assert time.time() < deadline
            time.sleep(0.002)
        in_buffer = {(e.extra["rollout_batch"], e.extra["rollout_group"]) for e in buffer.read()}
        assert (1, 1) in in_buffer  # the short group of batch 1 went in before its long sibling finished
    finally:
        producer.stop()


def test_resume_skips_groups_already_buffered_and_regenerates_the_rest():
    engine = FakeEngine(length=lambda b, g: 2)
    buffer = MemoryBuffer()
    # group 0 of batch 3 is in the buffer, ready (written before the crash): only group 1 is generated
    producer = make(buffer, 0, engine, state=ProducerState(3, {"position": 2}), taken=2, buffered=frozenset({(3, 0)}),
                    ready_groups=1)
    producer.loader = Loader(position=2)
    producer._batches = producer._prompt_batches()
    producer.offer_weights("w2", 2)
    producer.start()
    try:
        deadline = time.time() + 60
        while buffer.count() < N:
            assert time.time() < deadline
            time.sleep(0.002)
        time.sleep(0.1)
    finally:
        producer.stop()
    assert {(e.extra["rollout_batch"], e.extra["rollout_group"]) for e in buffer.read()} == {(3, 1)}
    assert producer.state().next_batch == 4  # batch 3 complete in the buffer: resume after it


def test_a_group_shares_its_oldest_version_and_keeps_each_rows_tokens():
    from hybrid_rl.buffer import Experience
    from hybrid_rl.trainer.ppo.stream_producer import group_versions

    def row(version, mask, versions=None):
        return Experience(uid="u", data_source="d", prompt_ids=[1], response_ids=[7] * len(mask), response_mask=mask,
                          reward=0.0, policy_version=version, token_versions=versions)

    rows = group_versions([row(4, [1, 0, 1]), row(3, [1, 1], [3, 4]), row(4, [1, 1], [4, 5])])
    assert [e.policy_version for e in rows] == [3, 3, 3]
    assert [e.token_versions for e in rows] == [[4, -1, 4], [3, 4], [4, 5]]  # each token's own version kept
    batch = batch_from_experiences(rows, 0, 4)
    assert batch.batch["rollout_versions"].tolist() == [[4, -1, 4, -1], [3, 4, -1, -1], [4, 5, -1, -1]]
    assert list(batch.non_tensor_batch["min_global_steps"]) == [4, 3, 4]  # veRL's span: the row's own
    buffer = MemoryBuffer()
    buffer.put(rows)
    assert buffer.drop_stale(5, 1) == 3  # the whole group, not the two rows whose own tokens are fresh


def test_the_trainer_never_takes_a_group_that_streamed_in_stale():
    """A stale group put after the step's first drop is neither counted nor taken."""
    from hybrid_rl.buffer import Experience

    buffer = MemoryBuffer()

    def group(version, uid):
        return [Experience(uid=uid, data_source="d", prompt_ids=[1], response_ids=[7], response_mask=[1], reward=0.0,
                           policy_version=version) for _ in range(N)]

    buffer.put(group(5, "fresh"))
    assert buffer.drop_stale(6, 1) == 0
    buffer.put(group(3, "late"))  # streamed in while the trainer waited
    buffer.put(group(6, "next"))
    taken = buffer.take(ROWS, 7, min_version=6 - 1)
    assert {e.uid for e in taken} == {"fresh", "next"}
