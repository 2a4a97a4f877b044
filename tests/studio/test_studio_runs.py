"""Launch and watch from the studio: progress read from a run folder; a real 2-step run launched."""

from __future__ import annotations

import json
import time

import pytest

from hybrid_rl.studio.runs import CONFIG_NAME, CONSOLE_LOG, read_progress, read_runs

fastapi = pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")

from hybrid_rl.studio.server import create_app  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402


def _write_run(folder, reward=0.5):
    rows = [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.25, "timing_s/validate": 3.0,
             "val-core/arithmetic/reward/best@2/std": 0.1},
            {"step": 1, "critic/score/mean": reward, "training/global_step": 1, "training/total_steps": 4,
             "timing_s/step": 2.0, "actor/pg_loss": 0.1}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "crit')
    samples = [{"step": 0, "response": f"#### {i}", "score": float(i % 2)} for i in range(5)]
    (folder / "val_generations.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_progress_keeps_the_curves_and_the_last_samples_and_skips_a_line_being_written(tmp_path):
    _write_run(tmp_path)
    (tmp_path / CONSOLE_LOG).write_text("".join(f"line {i}\n" for i in range(50)))
    progress = read_progress(str(tmp_path), num_samples=2)
    assert progress["metrics"] == [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.25, "timing_s/validate": 3.0},
                                   {"step": 1, "critic/score/mean": 0.5, "training/global_step": 1,
                                    "training/total_steps": 4, "timing_s/step": 2.0}]
    assert [s["response"] for s in progress["samples"]] == ["#### 3", "#### 4"]
    # step 1 of 4; 3 s of validation + 2 s of step; 3 steps left at 2 s each
    assert progress["status"] == {"step": 1, "total": 4, "elapsed_s": 5.0, "s_per_step": 2.0, "eta_s": 6.0}
    assert progress["console"] == [f"line {i}" for i in range(30, 50)]
    assert read_progress(str(tmp_path / "empty")) == {
        "run_dir": str((tmp_path / "empty").resolve()), "metrics": [], "samples": [], "console": [],
        "status": {"step": 0, "total": None, "elapsed_s": 0.0, "s_per_step": None, "eta_s": None}}


def test_a_folder_of_runs_is_read_as_several_runs(tmp_path):
    for name, reward in (("b", 0.75), ("a", 0.5)):
        (tmp_path / name).mkdir()
        _write_run(tmp_path / name, reward)
    both = read_runs(str(tmp_path))
    assert [r["name"] for r in both["runs"]] == ["a", "b"]
    assert [r["metrics"][1]["critic/score/mean"] for r in both["runs"]] == [0.5, 0.75]
    one = read_runs(str(tmp_path / "b"))
    assert [r["name"] for r in one["runs"]] == ["b"] and one["metrics"] == one["runs"][0]["metrics"]


def test_a_cli_runs_folder_is_watched_the_same_way_and_a_bad_folder_is_one_line(tmp_path, local_client):
    _write_run(tmp_path)
    client = local_client(create_app(TOKEN, roots=(str(tmp_path),)))
    assert client.get("/api/watch", params={"run_dir": str(tmp_path)}).json()["metrics"][1]["critic/score/mean"] == 0.5
    missing = client.get("/api/watch", params={"run_dir": str(tmp_path / "nope")})
    assert missing.status_code == 400 and "is not a folder" in missing.json()["error"]
    unknown = client.get("/api/runs/7")
    assert unknown.status_code == 404 and "no run 7" in unknown.json()["error"]
    charts = client.get("/api/schema").json()["charts"]
    assert [c["title"] for c in charts] == ["Reward", "Validation accuracy", "Response length", "KL", "Step time"]


def test_an_invalid_form_launches_nothing(tmp_path, local_client):
    client = local_client(create_app(TOKEN))
    response = client.post("/api/runs", json={"values": {"data.train_batch_size": "x"}})
    out = response.json()
    assert response.status_code == 400 and list(out["errors"]) == ["data.train_batch_size"] and "id" not in out


def _tiny_run(tmp_path, tiny_model_dir, steps: int) -> dict:
    return {"actor_rollout_ref.model.path": tiny_model_dir, "data.arithmetic.cache_dir": str(tmp_path / "data"),
             "data.arithmetic.num_train": "16", "data.arithmetic.num_test": "4", "data.arithmetic.num_shots": "0",
             "data.max_response_length": "8", "data.train_batch_size": "4", "actor_rollout_ref.rollout.n": "2",
             "actor_rollout_ref.rollout.name": "hf", "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
             "trainer.total_training_steps": str(steps), "trainer.val_before_train": "false",
             "trainer.default_local_dir": str(tmp_path / "run")}


def _wait(client, run_id, until, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while not until(state := client.get(f"/api/runs/{run_id}").json()) and time.monotonic() < deadline:
        time.sleep(1)
    return state


@pytest.mark.slow
def test_a_two_step_run_launched_from_the_page_shows_its_reward_curve(tmp_path, tiny_model_dir, monkeypatch,
                                                                     local_client):
    monkeypatch.chdir(tmp_path)
    texts = _tiny_run(tmp_path, tiny_model_dir, steps=2)
    client = local_client(create_app(TOKEN, roots=(tiny_model_dir,)))  # the model lies outside the working folder
    out = client.post("/api/runs", json={"values": texts}).json()
    assert out["errors"] == {} and (tmp_path / "run" / f"{CONFIG_NAME}.yaml").is_file()
    state = _wait(client, out["id"], lambda s: not s["running"])
    console = (tmp_path / "run" / CONSOLE_LOG).read_text()
    assert state["returncode"] == 0, console[-3000:]
    rewards = [m["critic/score/mean"] for m in state["metrics"] if "critic/score/mean" in m]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert state["status"]["step"] == state["status"]["total"] == 2 and state["status"]["s_per_step"] > 0


@pytest.mark.slow
def test_stop_ends_a_launched_run_as_ctrl_c_does(tmp_path, tiny_model_dir, monkeypatch, local_client):
    monkeypatch.chdir(tmp_path)
    client = local_client(create_app(TOKEN, roots=(tiny_model_dir,)))
    values = _tiny_run(tmp_path, tiny_model_dir, steps=500)
    run_id = client.post("/api/runs", json={"values": values}).json()["id"]
    assert _wait(client, run_id, lambda s: s["metrics"] or not s["running"])["running"]  # training
    again = client.post("/api/runs", json={"values": values}).json()  # the same folder, still in use
    assert "still writing to" in again["errors"]["trainer.default_local_dir"] and "id" not in again
    assert client.post(f"/api/runs/{run_id}/stop", json={}).json() == {"stopping": True}
    state = _wait(client, run_id, lambda s: not s["running"], timeout_s=120)
    assert not state["running"]  # ended long before its 500 steps
    assert len(state["metrics"]) < 500


def test_odd_rows_and_a_redrawn_progress_bar_do_not_break_the_status(tmp_path):
    from hybrid_rl.studio.runs import run_status

    rows = [{"critic/score/mean": 1.0}, {"step": None}, {"step": 1, "training/total_steps": None, "timing_s/step": None},
            {"step": 2, "training/total_steps": 3, "timing_s/step": 4.0}]
    assert run_status(rows) == {"step": 2, "total": 3, "elapsed_s": 4.0, "s_per_step": 4.0, "eta_s": 4.0}
    (tmp_path / CONSOLE_LOG).write_text("start\nTraining:  10%\rTraining:  50%\rTraining: 100%\ndone\n")
    assert read_progress(str(tmp_path))["console"] == ["start", "Training: 100%", "done"]
