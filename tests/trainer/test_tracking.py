"""Trackers, progress bar and the end-of-run plot."""

import importlib.machinery
import json
import logging
import sys
import types

import pytest

from hybrid_rl.trainer.core.plotting import plot_run, read_curves
from hybrid_rl.trainer.core.tracking import ProgressBar, Tracking, check_backends


def test_console_and_jsonl(tmp_path, caplog):
    tracker = Tracking("p", "e", ["console", "jsonl"], str(tmp_path))
    with caplog.at_level(logging.INFO, logger="hybrid_rl.trainer.core.tracking"):
        tracker.log({"critic/score/mean": 0.25, "bad": float("nan")}, step=1)
        tracker.log({"critic/score/mean": 0.5}, step=2)
    tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "critic/score/mean": 0.25, "bad": None}, {"step": 2, "critic/score/mean": 0.5}]
    assert "step:1" in caplog.text and "critic/score/mean:0.25" in caplog.text


def test_unknown_and_missing_backends():
    errors = check_backends(["console", "wandbb"])
    assert len(errors) == 1 and "wandbb" in errors[0] and "tensorboard" in errors[0]
    if importlib.util.find_spec("swanlab") is None:
        with pytest.raises(ValueError, match="swanlab package is not installed"):
            Tracking("p", "e", ["swanlab"], "/tmp/unused")


def _fake_module(name, monkeypatch, **attrs):
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    for key, value in attrs.items():
        setattr(mod, key, value)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def test_wandb_and_mlflow_adapters(tmp_path, monkeypatch):
    calls = []
    _fake_module(
        "wandb", monkeypatch,
        init=lambda **kw: calls.append(("wandb.init", kw)),
        log=lambda data, step: calls.append(("wandb.log", data, step)),
        finish=lambda: calls.append(("wandb.finish",)),
    )
    _fake_module(
        "mlflow", monkeypatch,
        set_experiment=lambda name: calls.append(("mlflow.exp", name)),
        start_run=lambda run_name: calls.append(("mlflow.start", run_name)),
        log_params=lambda p: calls.append(("mlflow.params", p)),
        log_metrics=lambda m, step: calls.append(("mlflow.log", m, step)),
        end_run=lambda: calls.append(("mlflow.end",)),
    )
    tracker = Tracking("proj", "exp", ["wandb", "mlflow"], str(tmp_path), config={"a": {"b": 1}})
    tracker.log({"val-core/x/reward/mean@1": 0.5}, step=3)
    tracker.finish()
    assert ("wandb.init", {"project": "proj", "name": "exp", "config": {"a": {"b": 1}}}) in calls
    assert ("wandb.log", {"val-core/x/reward/mean@1": 0.5}, 3) in calls
    assert ("mlflow.params", {"a.b": 1}) in calls
    assert ("mlflow.log", {"val-core/x/reward/mean_at_1": 0.5}, 3) in calls
    assert ("wandb.finish",) in calls and ("mlflow.end",) in calls


def test_progress_bar_runs():
    bar = ProgressBar(total_steps=3, initial_step=1, enabled=True)
    bar.update({"critic/score/mean": 0.5, "val-core/a/reward/mean@1": 0.25})
    assert bar._bar.n == 2
    bar.close()
    ProgressBar(3, 0, enabled=False).update({})


def test_plot_keeps_last_value_of_repeated_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "val-core/arithmetic/reward/mean@1": 0.1},
        {"step": 1, "critic/score/mean": 0.2},
        {"step": 2, "critic/score/mean": 0.9},  # lost when the run was killed ...
        {"step": 2, "critic/score/mean": 0.4},  # ... and redone after resuming
        {"step": 2, "val-core/arithmetic/reward/mean@1": 0.6},
        {"step": 2, "val-aux/calc/agent/tool/calculator/correct": 0.9, "val-aux/calc/agent/tool/calculator/error": 0.1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curves = read_curves(str(path))
    assert curves == {
        "val arithmetic/reward/mean@1": [(0, 0.1), (2, 0.6)],
        "train reward": [(1, 0.2), (2, 0.4)],
        "val calc used calculator correctly": [(2, 0.9)],
    }
    png = plot_run(str(path), str(tmp_path / "curve.png"), title="t")
    from PIL import Image

    img = Image.open(png)
    assert img.size[0] >= 400 and len(set(img.convert("RGB").getdata())) > 2  # something was drawn
    assert plot_run(str(tmp_path / "missing.jsonl"), str(tmp_path / "x.png")) is None


def test_sft_runs_plot_their_loss_curves(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/sft_loss": 0.9}, {"step": 1, "train/loss": 0.8},
            {"step": 2, "train/loss": 0.4, "val/sft_loss": 0.35, "val-core/arithmetic/reward/mean@1": 0.3}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_curves(str(path)) == {"val loss": [(0, 0.9), (2, 0.35)], "train loss": [(1, 0.8), (2, 0.4)],
                                      "val arithmetic/reward/mean@1": [(2, 0.3)]}


def test_pillow_fallback_when_matplotlib_is_missing(tmp_path, monkeypatch):
    import hybrid_rl.trainer.core.plotting as plotting

    def no_matplotlib(*args, **kwargs):
        raise ImportError("matplotlib")

    monkeypatch.setattr(plotting, "_plot_matplotlib", no_matplotlib)
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "critic/score/mean": 0.2}) + "\n" + json.dumps({"step": 2, "critic/score/mean": 0.6}) + "\n")
    png = plotting.plot_run(str(path), str(tmp_path / "curve.png"))
    from PIL import Image

    assert Image.open(png).size == (800, 450)


def test_plot_comparison_draws_one_series_of_several_runs(tmp_path):
    from hybrid_rl.trainer.core.plotting import plot_comparison

    key = "val-core/arithmetic/reward/mean@1"
    for name, values in (("a", [0.4, 0.6]), ("b", [0.4, 0.5])):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"step": step, key: value}) + "\n" for step, value in enumerate(values)))
    runs = {"A": str(tmp_path / "a.jsonl"), "B": str(tmp_path / "b.jsonl"), "C": str(tmp_path / "missing.jsonl")}
    png = plot_comparison(runs, str(tmp_path / "cmp.png"), "val arithmetic/reward/mean@1", lines={"teacher": 0.8})
    assert png and (tmp_path / "cmp.png").stat().st_size > 1000
    assert plot_comparison(runs, str(tmp_path / "none.png"), "val other/reward/mean@1") is None
