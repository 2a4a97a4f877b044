"""The timeline route: a run's spans by step range, read as the file grows, only inside the studio's folders."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")

from hybrid_rl.studio import timeline as studio_timeline  # noqa: E402
from hybrid_rl.studio.server import create_app  # noqa: E402
from hybrid_rl.trainer.core.timeline import TIMELINE_FILE  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402


def _span(step, name, start, end, worker="trainer", **extra):
    return {"step": step, "worker": worker, "name": name, "start": start, "end": end, **extra}


def _write(path, spans, mode="a"):
    with open(path, mode, encoding="utf-8") as f:
        f.write("".join(json.dumps(s) + "\n" for s in spans))


def _steps(n, t0=100.0):
    """n steps of 10 s each: generate 4 s, update 5 s, 1 s of gap; a producer span in each."""
    out = []
    for k in range(1, n + 1):
        s = t0 + 10 * (k - 1)
        out += [_span(k, "generate", s, s + 4), _span(k, "update_actor", s + 4, s + 9),
                _span(k, "generate", s + 2, s + 8, worker="rollout", batch=k + 1), _span(k, "step", s, s + 9.5)]
    return out


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_last_steps_by_default_a_range_when_asked(work, local_client):
    run = work / "run"
    run.mkdir()
    _write(run / TIMELINE_FILE, [_span(0, "validate", 90.0, 99.0)] + _steps(12))
    client = local_client(create_app(TOKEN))
    out = client.get("/api/timeline", params={"run_dir": "run"}).json()
    assert (out["first"], out["last"], out["max_step"]) == (12 - studio_timeline.DEFAULT_STEPS + 1, 12, 12)
    assert out["lanes"] == ["trainer", "rollout"] and out["names"] == ["generate", "update_actor", "step"]
    assert out["run"] is None  # the folder's own timeline (a folder of runs names the run it shows)
    assert [b["step"] for b in out["steps"]] == list(range(5, 13))
    assert out["steps"][0] == {"step": 5, "start": 140.0, "end": 149.5, "done": True}
    out = client.get("/api/timeline", params={"run_dir": "run", "first": "0", "last": "1"}).json()
    assert [(s["step"], s["worker"], s["name"]) for s in out["spans"]] == [
        (0, "trainer", "validate"), (1, "trainer", "generate"), (1, "trainer", "update_actor"),
        (1, "rollout", "generate"), (1, "trainer", "step")]
    assert out["spans"][3]["batch"] == 2  # extra keys ride along


def test_a_growing_file_is_followed_and_a_half_written_line_waits(work, local_client):
    run = work / "run"
    run.mkdir()
    _write(run / TIMELINE_FILE, _steps(1))
    client = local_client(create_app(TOKEN))
    assert client.get("/api/timeline", params={"run_dir": "run"}).json()["max_step"] == 1
    # step 2 going: its generate is written, its update half-written, no step span yet
    with open(run / TIMELINE_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(_span(2, "generate", 110.0, 114.0)) + "\n" + '{"step": 2, "worker": "tra')
    out = client.get("/api/timeline", params={"run_dir": "run"}).json()
    assert out["max_step"] == 2 and out["steps"][-1] == {"step": 2, "start": 110.0, "end": 114.0, "done": False}
    with open(run / TIMELINE_FILE, "a", encoding="utf-8") as f:
        f.write('iner", "name": "update_actor", "start": 114.0, "end": 119.0}\nnot json\n[1]\n'
                + json.dumps({"step": "x", "worker": "trainer", "name": "n", "start": 0, "end": 1}) + "\n")
    out = client.get("/api/timeline", params={"run_dir": "run", "first": "2"}).json()
    assert [s["name"] for s in out["spans"]] == ["generate", "update_actor"]  # the junk lines skipped
    _write(run / TIMELINE_FILE, [_span(1, "generate", 0.0, 1.0)], mode="w")  # the run started over: read anew
    assert client.get("/api/timeline", params={"run_dir": "run"}).json()["max_step"] == 1


def test_a_folder_of_runs_shows_the_first_run_with_a_timeline_and_an_empty_one_says_why(work, local_client):
    for name in ("b", "c"):
        (work / "runs" / name).mkdir(parents=True)
    _write(work / "runs" / "c" / TIMELINE_FILE, _steps(2))
    client = local_client(create_app(TOKEN))
    out = client.get("/api/timeline", params={"run_dir": "runs"}).json()
    assert out["run"] == "c" and out["max_step"] == 2
    empty = client.get("/api/timeline", params={"run_dir": "runs/b"}).json()
    assert empty["spans"] == [] and empty["message"].startswith("no timeline.jsonl in")


def test_bad_requests_get_one_line_and_nothing_outside_is_read(work, local_client, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside_timeline")
    _write(outside / TIMELINE_FILE, _steps(1))
    (work / "run").mkdir()
    (work / "run" / TIMELINE_FILE).symlink_to(outside / TIMELINE_FILE)  # a link out of the folders
    (work / "file.txt").write_text("x")
    client = local_client(create_app(TOKEN))
    cases = [({"run_dir": str(outside)}, 403, f"run_dir={str(outside)!r} is outside the studio's folders"),
             ({"run_dir": "run\x00"}, 400, "run_dir='run\\x00' holds a NUL character, which no path can"),
             ({"run_dir": "file.txt"}, 400, "run_dir='file.txt' is not a folder. Fix: give a run's trainer.default_local_dir"),
             ({"run_dir": "run", "first": "two"}, 400, "first='two' is not a step number. Fix: give a whole number"),
             ({"run_dir": "run", "last": "-1"}, 400, "last='-1' is not a step number"),
             ({"run_dir": "run", "first": "3", "last": "2"}, 400, "first=3 is after last=2. Fix: give first <= last")]
    for params, status, message in cases:
        response = client.get("/api/timeline", params=params)
        assert response.status_code == status, params
        assert response.json()["error"].startswith(message) and "\n" not in response.json()["error"], params
    assert client.get("/api/timeline", params={"run_dir": "run"}).json()["spans"] == []  # the link is not followed
    assert local_client(create_app(TOKEN), token=None).get(
        "/api/timeline", params={"run_dir": "run"}).status_code == 401
