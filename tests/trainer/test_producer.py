"""The decoupled mode's rollout producer, the staleness rule and the async metrics, without Ray:
fake generate / score callables over a fake loader, a trainer loop in the test thread."""

import threading
import time

import numpy as np
import pytest
import torch

from hybrid_rl.algorithms import behaviour_weight_stats
from hybrid_rl.buffer import MemoryBuffer, batch_from_experiences
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.ppo.decoupled import staleness_metrics
from hybrid_rl.trainer.ppo.producer import ProducerState, RolloutProducer, may_start_batch

ROWS = 4  # rows per batch


class FakeLoader:
    """Batches ``{"idx": [position]}`` forever in epochs of 5, with a resumable position."""

    def __init__(self, position=0):
        self.position = position

    def __iter__(self):
        while True:
            self.position += 1
            yield {"input_ids": torch.full((ROWS, 2), self.position), "pos": np.array([self.position] * ROWS, dtype=object)}
            if self.position % 5 == 0:
                return

    def state_dict(self):
        return {"position": self.position}


class Tok:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def wait_until(condition, timeout_s=120.0):
    """Poll ``condition`` until it holds; fail the test after ``timeout_s`` (a hang detector, generous so
    that a slow or loaded machine never trips it)."""
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, "timed out waiting for the producer"
        time.sleep(0.01)


def fake_generate(batch, index, metrics):
    rows = len(batch)
    metrics["gen/index"] = float(index)
    return DataProto.from_dict(
        tensors={"prompts": batch.batch["input_ids"], "responses": torch.full((rows, 3), index),
                 "response_mask": torch.ones(rows, 3, dtype=torch.long),
                 "attention_mask": torch.ones(rows, 5, dtype=torch.long)},
        non_tensors={"uid": np.array([f"{index}-{i // 2}" for i in range(rows)], dtype=object),
                     "pos": batch.non_tensor_batch["pos"]})


def fake_score(batch, metrics):
    batch.batch["token_level_scores"] = torch.zeros(len(batch), 3)
    metrics["reward/mean"] = 1.0
    return batch


def make_producer(buffer, eta, loads, state=None, taken=0, ready=0, generate=fake_generate):
    return RolloutProducer(
        loader=FakeLoader(), state=state or ProducerState(1, {"position": 0}), generate=generate, score=fake_score,
        load_weights=lambda w: loads.append(w) or {"timing_s/weight_load": 0.0}, buffer=buffer, tokenizer=Tok(),
        eta=eta, taken_batches=taken, ready_batches=ready)


@pytest.mark.parametrize("taken,ready,running,version,eta,expected", [
    (0, 0, 0, None, 3, False),  # no weights loaded yet
    (0, 0, 0, 0, 0, True), (0, 0, 1, 0, 0, False), (0, 1, 0, 0, 0, False),  # eta 0: one batch at a time
    (3, 0, 0, 3, 0, True), (3, 0, 0, 2, 0, False),  # step 4 needs version 3
    (0, 1, 0, 0, 1, True), (0, 1, 1, 0, 1, False), (5, 1, 0, 5, 2, True), (5, 2, 1, 5, 2, False)])
def test_may_start_batch_is_arealS_capacity(taken, ready, running, version, eta, expected):
    assert may_start_batch(taken, ready, running, version, eta) is expected


def run_trainer(producer, buffer, steps, eta, sync_every=1, work_s=0.0):
    """The trainer's side: drop stale, take one batch per step, 'train', offer weights. Returns
    (taken experiences per step, dropped rows)."""
    taken, dropped = [], 0
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        for step in range(1, steps + 1):
            n = buffer.drop_stale(step - 1, eta)
            dropped += n
            if n:
                producer.dropped(n // ROWS)
            deadline = time.time() + 120  # a hang detector: generous for a slow or loaded machine
            while buffer.count("ready") < ROWS:
                producer.check()
                assert time.time() < deadline, "the producer stalled"
                time.sleep(0.005)
            taken.append(buffer.take(ROWS, step))
            producer.consumed(1)
            time.sleep(work_s)
            if step % sync_every == 0:
                producer.offer_weights(f"w{step}", step)
    finally:
        producer.stop()
    return taken, dropped


@pytest.mark.parametrize("eta,sync_every", [(0, 1), (1, 1), (2, 1), (2, 3)])
def test_trained_rows_are_never_staler_than_eta_and_batches_come_in_order(eta, sync_every):
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, eta, loads)
    taken, dropped = run_trainer(producer, buffer, steps=8, eta=eta, sync_every=sync_every, work_s=0.01)
    assert dropped == 0  # the capacity rule makes drops unnecessary in a steady run
    for step, rows in enumerate(taken, start=1):
        assert len(rows) == ROWS
        assert all(0 <= (step - 1) - e.policy_version <= eta for e in rows), (step, [e.policy_version for e in rows])
        assert {e.extra["rollout_batch"] for e in rows} == {step}  # one whole batch, in order
    if eta > 0:  # the rollout did run ahead of the trainer
        assert any((step - 1) - rows[0].policy_version > 0 for step, rows in enumerate(taken, start=1))
    if eta == 0:  # synchronous order: batch k is generated with the weights after step k - 1
        assert [rows[0].policy_version for rows in taken] == list(range(8))
    assert loads[0] == "w0"


def test_eta_zero_never_runs_ahead():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 0, loads)
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        wait_until(lambda: buffer.count() >= ROWS)
        time.sleep(0.3)
        assert buffer.count() == ROWS  # nothing more until the trainer takes and pushes version 1
        assert producer.state().next_batch == 2
    finally:
        producer.stop()


def test_metrics_state_jobs_and_errors():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 1, loads)
    assert producer.call(lambda: "inline") == "inline"  # not started: runs here
    taken, _ = run_trainer(producer, buffer, steps=2, eta=1)
    metrics = producer.pop_metrics({1, 2})
    assert metrics["gen/index"] == 1.5 and metrics["reward/mean"] == 1.0
    assert "timing_s/rollout_generate" in metrics and "timing_s/rollout_idle" in metrics
    state = producer.state()  # the first batch not in the buffer, and the loader before drawing it
    assert state.loader == {"position": state.next_batch - 1}

    def failing(batch, index, metrics):
        raise RuntimeError("engine died")

    broken = make_producer(MemoryBuffer(), 1, [], generate=failing)
    broken.offer_weights("w0", 0)
    broken.start()
    with pytest.raises(RuntimeError, match="rollout producer failed: engine died"):
        wait_until(lambda: broken.check())  # check() raises once the generation thread has died
    broken.stop()


def test_job_runs_between_generations_after_offered_weights():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 0, loads)
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        producer.offer_weights("w-val", 0)
        seen = producer.call(lambda: list(loads))
        assert seen[-1] == "w-val"  # offered weights load before the job runs
    finally:
        producer.stop()


def test_resume_skips_batches_already_buffered():
    buffer, loads = MemoryBuffer(), []
    state = ProducerState(next_batch=3, loader={"position": 2}, skip_through=4)
    producer = make_producer(buffer, 0, loads, state=state, taken=2)
    producer.loader = FakeLoader(position=2)
    producer._batches = producer._prompt_batches()
    producer.offer_weights("w2", 2)
    producer.start()
    try:
        wait_until(lambda: buffer.count() >= ROWS)
    finally:
        producer.stop()
    rows = buffer.read()
    assert {e.extra["rollout_batch"] for e in rows} == {5}  # 3 and 4 skipped: already in the buffer
    assert {e.extra["pos"] for e in rows} == {5}  # ... and their prompts drawn, not regenerated


def test_staleness_and_importance_weight_metrics():
    m = staleness_metrics([3, 3, 2, 4], trainer_version=4)  # lags 1, 1, 2, 0
    assert m["async/staleness_mean"] == 1.0 and m["async/staleness_max"] == 2.0
    assert m["async/staleness_hist/0"] == 0.25 and m["async/staleness_hist/1"] == 0.5
    newer = staleness_metrics([5, 4], trainer_version=4)  # a row of newer weights shows as it is, not as 0
    assert newer["async/staleness_mean"] == -0.5 and newer["async/staleness_hist/-1"] == 0.5
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    behav = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))  # weights 2, 1, 9
    mask = torch.tensor([[1, 1, 0]])
    w = behaviour_weight_stats(old, behav, mask, cap=1.5)
    assert w["behav_imp_weight/mean"] == pytest.approx(1.5)
    assert w["behav_imp_weight/max"] == pytest.approx(2.0) and w["behav_imp_weight/min"] == pytest.approx(1.0)
    assert w["behav_imp_weight/capped_frac"] == 0.5
    assert behaviour_weight_stats(old, behav, torch.zeros_like(mask)) == {}


def test_round_trip_keeps_shared_extra_columns_and_prompt_width():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 0, loads)
    taken, _ = run_trainer(producer, buffer, steps=1, eta=0)
    batch = batch_from_experiences(taken[0], pad_token_id=0, response_length=4, prompt_length=3)
    assert batch.batch["prompts"].shape == (ROWS, 3) and batch.batch["responses"].shape == (ROWS, 4)
    assert list(batch.non_tensor_batch["pos"]) == [1] * ROWS
    assert list(batch.non_tensor_batch["rollout_batch"]) == [1] * ROWS
    with pytest.raises(ValueError, match="prompt_length=1"):
        batch_from_experiences(taken[0], pad_token_id=0, response_length=4, prompt_length=1)


def test_memory_buffer_forgets_what_a_checkpoint_made_final():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 1, loads)
    run_trainer(producer, buffer, steps=3, eta=1)
    before = buffer.count()
    assert buffer.forget_taken(2) == 2 * ROWS
    assert buffer.count() == before - 2 * ROWS and buffer.count("taken") == ROWS
    state = buffer.state_dict()
    again = MemoryBuffer()
    again.load_state_dict(state)
    ids = again.put(buffer.read(limit=1))
    assert ids[0] > max(e.id for e in buffer.read())  # ids keep increasing after forgetting


def test_slow_reward_scores_batches_in_flight_concurrently_and_puts_them_in_order():
    """Batch 1's scorer returns only once batches 2 and 3 have been scored: serially it would wait out
    its 60 s and see neither; events, not timings, so a slow or loaded machine cannot fail it."""
    buffer, loads = MemoryBuffer(), []
    scored = {2: threading.Event(), 3: threading.Event()}
    seen_while_batch_1_scored = []

    def slow_score(batch, metrics):
        index = int(batch.batch["responses"][0, 0])
        if index == 1:
            seen_while_batch_1_scored.extend(scored[i].wait(60) for i in (2, 3))
        result = fake_score(batch, metrics)
        if index in scored:
            scored[index].set()
        return result

    producer = RolloutProducer(
        loader=FakeLoader(), state=ProducerState(1, {"position": 0}), generate=fake_generate, score=slow_score,
        load_weights=lambda w: {}, buffer=buffer, tokenizer=Tok(), eta=2, taken_batches=0, ready_batches=0)
    producer.offer_weights("w0", 0)
    start = time.perf_counter()
    producer.start()
    try:
        while buffer.count() < 3 * ROWS:
            assert time.perf_counter() - start < 300, "the producer hung"
            time.sleep(0.005)
    finally:
        producer.stop()
    assert seen_while_batch_1_scored == [True, True]  # batches 2 and 3 were scored while batch 1 was
    assert [e.extra["rollout_batch"] for e in buffer.read()] == [1] * ROWS + [2] * ROWS + [3] * ROWS


def test_call_after_stop_runs_inline_and_metrics_of_skipped_batches_are_pruned():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 1, loads)
    run_trainer(producer, buffer, steps=3, eta=1)
    assert producer.call(lambda: "after stop") == "after stop"  # never queued for a stopped thread
    metrics = producer.pop_metrics({3})  # batches 1-2 were never popped (as if dropped): pruned
    assert "gen/index" in metrics and all(i >= 3 for i in producer._metrics)


def test_stalled_when_the_counts_say_ready_but_the_buffer_has_no_batch():
    buffer, loads = MemoryBuffer(), []
    producer = make_producer(buffer, 0, loads, ready=1)  # e.g. a resume with another batch size
    producer.offer_weights("w0", 0)
    producer.start()
    try:
        wait_until(producer.stalled)
        assert buffer.count() == 0
    finally:
        producer.stop()


def test_resume_checks_refuse_what_would_skip_or_repeat_batches(tmp_path):
    from types import SimpleNamespace

    from hybrid_rl.trainer import get_config, to_ppo_config
    from hybrid_rl.trainer.ppo.decoupled import DecoupledPPOTrainer

    cfg = to_ppo_config(get_config(["async_training.enable=true"]))
    fake = SimpleNamespace(config=cfg, resumed_state={"async": {}}, buffer=MemoryBuffer(), rows_per_batch=128,
                           run_dir=str(tmp_path))
    fake._buffer_where = lambda: "the memory buffer"
    check = DecoupledPPOTrainer._check_resumable
    check(fake, {"storage_type": "memory", "rows_per_batch": 128})  # the same run: fine
    with pytest.raises(ValueError, match="storage_type=sql"):
        check(fake, {"storage_type": "sql", "rows_per_batch": 128})
    with pytest.raises(ValueError, match="batches have 64 rows and this run's 128"):
        check(fake, {"storage_type": "memory", "rows_per_batch": 64})
    fake.resumed_state = None  # a fresh start over a buffer that holds rows
    fake.buffer.put(make_experiences())
    check(fake, {})  # resume_mode=auto: the rows of a run that died before its first checkpoint
    fake.config.trainer.resume_mode = "disable"
    with pytest.raises(ValueError, match="resume_mode=disable starts over, but the memory buffer already holds"):
        check(fake, {})


def test_a_decoupled_checkpoint_is_refused_in_the_synchronous_mode(tmp_path):
    from types import SimpleNamespace

    from hybrid_rl.trainer import get_config, to_ppo_config
    from hybrid_rl.trainer.config.checks import resume_point_problems

    point = SimpleNamespace(step_dir=str(tmp_path), state={"world_size": 1, "async": {"next_batch": 4}})
    problems = resume_point_problems(to_ppo_config(get_config([])), point)
    assert len(problems) == 1 and "async_training.enable=true" in problems[0]
    assert resume_point_problems(to_ppo_config(get_config(["async_training.enable=true"])), point) == []


def make_experiences():
    from hybrid_rl.buffer import Experience

    return [Experience(uid="u", data_source="d", prompt_ids=[1], response_ids=[2], response_mask=[1], reward=0.0,
                       policy_version=0, extra={"rollout_batch": 7})]
