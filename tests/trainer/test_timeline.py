"""The step timeline (``timeline.jsonl``): the writer, ``timed``'s spans, and the spans of a short synchronous
run with in-process fake workers (trainer_fakes.py) checked against the step plan and ``metrics.jsonl``."""

import json
import os
import stat
import threading
import time

import pytest

from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.core.loop import timed
from hybrid_rl.trainer.core.timeline import TIMELINE_FILE, SpanRun, Timeline, thread_lane
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

from test_driver_loop import _overrides
from trainer_fakes import FakeActorRollout, FakePool


def _spans(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_timed_records_the_seconds_it_adds_with_a_wall_clock_start():
    timing, spans = {"generate": 1.0}, []
    before = time.time()
    with timed("generate", timing, lambda *span: spans.append(span)):
        time.sleep(0.02)
    with timed("adv", timing):  # without a recorder: as before
        pass
    (name, start, end), = spans
    assert name == "generate" and before <= start <= end <= time.time()
    assert timing["generate"] - 1.0 == pytest.approx(end - start, abs=1e-6) and end - start >= 0.02
    assert set(timing) == {"generate", "adv"}


def test_the_writer_appends_whole_lines_privately_from_many_threads(tmp_path):
    path = str(tmp_path / TIMELINE_FILE)
    timeline = Timeline(path)
    timeline.step = 7

    def write(i):
        for j in range(50):
            timeline.record(f"reward/{i}", "reward", j, j + 0.5, batch=j)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with timeline.span("trainer", "update_actor"):
        pass
    timeline.close()
    timeline.record("trainer", "late", 0, 1)  # after close: dropped, no error
    rows = _spans(path)
    assert len(rows) == 201 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert rows[0].keys() == {"step", "worker", "name", "start", "end", "batch"} and rows[0]["step"] == 7
    assert sorted(r["worker"] for r in rows[:-1]).count("reward/3") == 50
    assert rows[-1]["name"] == "update_actor" and rows[-1]["start"] <= rows[-1]["end"]
    assert Timeline(str(tmp_path / TIMELINE_FILE)).enabled and not Timeline(None).enabled
    Timeline(None).record("trainer", "x", 0, 1)  # records nothing, anywhere


def test_a_run_of_polls_is_one_span_and_a_gap_starts_another(tmp_path):
    timeline = Timeline(str(tmp_path / TIMELINE_FILE))
    run = SpanRun(timeline, "rollout", "wait_capacity", gap_s=0.01)
    for start in (0.0, 0.1, 0.2):  # each poll starts 1 ms after the last ended
        run.add(start + 0.001 * (start > 0), start + 0.1)
    run.add(1.0, 1.1)  # 0.8 s later: a new span
    run.flush()
    run.flush()  # nothing open: nothing written
    timeline.close()
    assert [(r["start"], r["end"]) for r in _spans(tmp_path / TIMELINE_FILE)] == [(0.0, pytest.approx(0.3)),
                                                                               (1.0, 1.1)]
    pool_thread = threading.Thread(target=lambda: lanes.append(thread_lane("reward")), name="hybrid_rl-reward_3")
    lanes = []
    pool_thread.start()
    pool_thread.join()
    assert lanes == ["reward/3"]


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, tiny_model_dir):
    """Two steps with fake workers; validation before training and at each step, a checkpoint at each."""
    tmp_path = tmp_path_factory.mktemp("timeline_sync")
    trainer = RayPPOTrainer(get_config(_overrides(tmp_path, tiny_model_dir, "trainer.total_training_steps=2",
                                                  "trainer.save_freq=1", "trainer.test_freq=1",
                                                  "trainer.val_before_train=true")))
    trainer.workers = WorkerGroups(FakeActorRollout(), None, FakePool())
    trainer.fit()
    run = tmp_path / "run"
    metrics = {r["step"]: r for r in map(json.loads, open(run / "metrics.jsonl"))}
    return trainer, _spans(run / TIMELINE_FILE), metrics


def test_every_named_step_of_a_sync_step_is_a_span_in_plan_order_as_long_as_its_timing(sync_run):
    trainer, spans, metrics = sync_run
    assert {s["worker"] for s in spans} == {"trainer"}  # the synchronous mode: the driver's lane only
    (before,) = [s for s in spans if s["step"] == 0]
    assert before["name"] == "validate" and before["end"] - before["start"] == pytest.approx(
        metrics[0]["timing_s/validate"], abs=1e-6)
    for step in (1, 2):
        trainer.global_steps = step
        plan = trainer.step_plan()
        assert {"generate", "update_actor", "validate", "save_checkpoint"} <= set(plan)
        (whole,) = [s for s in spans if s["step"] == step and s["name"] == "step"]
        named = sorted((s for s in spans if s["step"] == step and s["name"] != "step"), key=lambda s: s["start"])
        assert [s["name"] for s in named] == plan
        for s in named:  # each lasts its timing_s/<name> and lies within its step
            assert s["end"] - s["start"] == pytest.approx(metrics[step][f"timing_s/{s['name']}"], abs=1e-6)
            assert whole["start"] <= s["start"] <= s["end"] <= whole["end"] + 1e-6
        for a, b in zip(named, named[1:]):  # one lane, one thing at a time
            assert a["end"] <= b["start"] + 1e-6
        assert whole["end"] - whole["start"] == pytest.approx(metrics[step]["timing_s/step"], abs=1e-6)
    steps = [s for s in spans if s["name"] == "step"]
    assert steps[0]["end"] <= steps[1]["start"]


def test_no_jsonl_logger_no_timeline(tmp_path, tiny_model_dir):
    trainer = RayPPOTrainer(get_config(_overrides(tmp_path, tiny_model_dir, "trainer.total_training_steps=1",
                                                  "trainer.save_freq=-1", "trainer.logger=[console]")))
    trainer.workers = WorkerGroups(FakeActorRollout(), None, FakePool())
    trainer.fit()
    assert not (tmp_path / "run" / TIMELINE_FILE).exists()


def test_a_timeline_that_cannot_be_written_is_logged_once_and_the_run_goes_on(tmp_path, caplog):
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / TIMELINE_FILE).symlink_to(tmp_path / "elsewhere")  # a link in its place is not followed
    with caplog.at_level("WARNING"):
        timeline = Timeline(str(tmp_path / TIMELINE_FILE))
        timeline.record("trainer", "generate", 0, 1)
    assert not timeline.enabled and (tmp_path / "elsewhere").read_text() == ""
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"the step timeline {tmp_path / TIMELINE_FILE} is not written from here on (")
    full = Timeline("/dev/full")  # every write fails: no space left
    with caplog.at_level("WARNING"):
        full.record("trainer", "generate", 0, 1)
        full.record("trainer", "update_actor", 1, 2)
    assert not full.enabled and sum("No space left" in r.getMessage() for r in caplog.records) == 1
