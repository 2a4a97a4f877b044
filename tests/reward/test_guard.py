"""The reward guard: raise / NaN / None / str / timeout / crash all score 0.0 with the right status."""

import math
import os
import threading
import time

import numpy as np
import pytest
import torch

from hybrid_rl.reward import _isolation
from hybrid_rl.reward.guard import ScoreOutcome, normalize_score, run_guarded, safe_score, safe_score_many
from tests.reward.hang import BUDGET_S, HANG_S, RELEASE as _RELEASE

MODES = ["process", "thread"]


def _raise(*_, **__):
    raise RuntimeError("scorer bug")


def _exit(*_, **__):
    raise SystemExit(3)


def _sleep(seconds):
    _RELEASE.wait(seconds)  # time.sleep that the end of the test cuts short
    return 1.0


@pytest.mark.parametrize(
    "raw, expected",
    [
        (1, ScoreOutcome(1.0, {}, "ok")),
        (0.25, ScoreOutcome(0.25, {}, "ok")),
        (True, ScoreOutcome(1.0, {}, "ok")),
        (np.float32(0.5), ScoreOutcome(0.5, {}, "ok")),
        (torch.tensor(2.0), ScoreOutcome(2.0, {}, "ok")),
        ({"score": -1, "acc": False, "pred": "7"}, ScoreOutcome(-1.0, {"acc": False, "pred": "7"}, "ok")),
    ],
)
def test_normalize_valid(raw, expected):
    assert normalize_score(raw) == expected


@pytest.mark.parametrize("raw", [float("nan"), float("inf"), -float("inf"), None, "1.0", [1.0], {"acc": 1},
                                 {"score": None}, {"score": float("nan")}, torch.tensor([1.0, 2.0]), object()])
def test_normalize_invalid(raw):
    outcome = normalize_score(raw)
    assert (outcome.score, outcome.status) == (0.0, "invalid")
    assert outcome.message


def test_normalize_stringifies_unplain_extras():
    outcome = normalize_score({"score": 1.0, "obj": [1, 2], "n": np.int64(3)})
    assert outcome.extra == {"obj": "[1, 2]", "n": 3}


def test_numpy_and_torch_scalars_in_extras_become_python_values_and_one_odd_one_spoils_nothing():
    import torch

    outcome = normalize_score({"score": 1.0, "acc": np.bool_(False), "x": np.float32(0.5), "t": torch.tensor(2),
                               "c": np.complex128(1j), "meta": torch.empty((), device="meta")})
    assert outcome.extra["acc"] is False and outcome.extra["x"] == 0.5 and outcome.extra["t"] == 2
    assert outcome.extra["c"] == 1j and "meta" in outcome.extra["meta"]  # kept as its text


@pytest.mark.parametrize("mode", MODES)
def test_safe_score_statuses(mode):
    assert safe_score(lambda s, gt: float(s == gt), "a", gt="a", isolation=mode) == ScoreOutcome(1.0, {}, "ok")
    err = safe_score(_raise, isolation=mode)
    assert (err.score, err.status) == (0.0, "error") and "RuntimeError: scorer bug" in err.message
    assert safe_score(_exit, isolation=mode).status == "error"  # SystemExit does not end training
    for bad in (float("nan"), None, "0.9"):
        assert safe_score(lambda b=bad: b, isolation=mode)[:3] == (0.0, {}, "invalid")


@pytest.mark.parametrize("mode", MODES)
def test_hung_scorer_returns_promptly(mode):
    start = time.perf_counter()
    out = safe_score(_sleep, HANG_S, timeout_s=0.2, isolation=mode)
    assert out[:3] == (0.0, {}, "timeout") and "0.2s" in out.message
    assert time.perf_counter() - start < HANG_S / 2  # ~0.25 s on a quiet machine


@pytest.mark.parametrize("mode", MODES)
def test_timeout_hits_only_its_item(mode):
    start = time.perf_counter()
    calls = [((0.0,), {}), ((HANG_S,), {}), ((0.0,), {})]
    out = safe_score_many(_sleep, calls, timeout_s=BUDGET_S, isolation=mode)
    assert [o.status for o in out] == ["ok", "timeout", "ok"]
    assert [o.score for o in out] == [1.0, 0.0, 1.0]
    assert time.perf_counter() - start < BUDGET_S + HANG_S / 2  # not held for the hang


def test_process_isolation_survives_gil_holding_code_and_hard_exits():
    """What a thread cannot do: interrupt C code holding the GIL, survive os._exit / a killed child."""
    start = time.perf_counter()
    out = safe_score_many(lambda k: k(), [((lambda: 10 ** 10 ** 10,), {}), ((lambda: os._exit(7),), {}),
                                          ((lambda: os.kill(os.getpid(), 9),), {}), ((lambda: 0.5,), {})],
                          timeout_s=BUDGET_S, isolation="process")
    assert [o.status for o in out] == ["timeout", "error", "error", "ok"]
    assert "exit code 7" in out[1].message and "signal 9" in out[2].message
    assert out[3].score == 0.5
    assert time.perf_counter() - start < BUDGET_S + HANG_S / 2  # 10 ** 10 ** 10 would take for ever


def test_process_results_must_pickle():
    out = safe_score(lambda: {"score": 1.0, "gen": (i for i in range(3))}, isolation="process")
    assert out.status == "ok" and out.extra["gen"].startswith("<generator")  # extras are stringified
    status, message = run_guarded(lambda: (i for i in range(3)), timeout_s=BUDGET_S, isolation="process")
    assert status == "error" and "not picklable" in message


def test_thread_mode_bounds_abandoned_threads(monkeypatch):
    monkeypatch.setattr(_isolation, "MAX_ABANDONED_THREADS", 2)
    monkeypatch.setattr(_isolation, "_abandoned_threads", [])
    release = threading.Event()
    started = []
    out = safe_score_many(lambda: started.append(1) or release.wait(HANG_S), [((), {})] * 4, timeout_s=0.05,
                          isolation="thread")
    assert [o.status for o in out] == ["timeout"] * 4
    assert "refused" in out[2].message and "refused" in out[3].message
    assert len(_isolation._abandoned_threads) == 2  # no third thread was started
    deadline = time.monotonic() + 120  # a hang detector, generous for a loaded machine
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # on a loaded machine a started thread may get its first turn late
    assert len(started) == 2
    release.set()
    deadline = time.monotonic() + 120
    while _isolation._num_abandoned_threads() and time.monotonic() < deadline:
        time.sleep(0.01)  # the abandoned threads finish on their own...
    assert safe_score(_sleep, 0.0, timeout_s=30.0, isolation="thread").status == "ok"  # ...and work resumes


def test_no_timeout_and_bad_isolation():
    assert safe_score(_sleep, 0.0, timeout_s=0, isolation="thread").status == "ok"
    with pytest.raises(ValueError, match="isolation must be one of"):
        safe_score(_sleep, 0.0, isolation="subinterpreter")


def test_many_calls_use_one_process_and_keep_order(monkeypatch):
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    out = safe_score_many(lambda x: math.sqrt(x), [((float(i),), {}) for i in range(300)], timeout_s=BUDGET_S)
    assert [o.score for o in out] == [math.sqrt(i) for i in range(300)]
    assert len(forks) == 1
    safe_score_many(_sleep, [((0.0,), {}), ((HANG_S,), {}), ((0.0,), {})], timeout_s=BUDGET_S)
    assert len(forks) == 3  # a timeout costs exactly one extra fork
