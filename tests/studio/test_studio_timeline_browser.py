"""The step timeline in a real browser (headless Chromium, as test_studio_browser.py, same skip rule): a
finished synchronous run and a finished decoupled run (2 steps each on the tiny model, through the CLI).

``HYBRID_RL_STUDIO_SCREENSHOTS=DIR`` saves the two timelines (``docs/studio/`` holds the committed ones).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.studio.test_studio_browser import SCREENSHOTS, page, studio_url  # noqa: F401 (the fixtures)
from tests.trainer.test_e2e import _assert_ok, _run_cli
from tests.trainer.test_e2e_async import DECOUPLED_LOSS, _async_args, _reward_args

from hybrid_rl.trainer.core.timeline import TIMELINE_FILE

pytestmark = pytest.mark.slow

ONE_WORKER = ["trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.n_gpus_per_node=1"]


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory, tiny_model_dir):
    """``{"sync": run folder, "decoupled": run folder}``, each of 2 finished steps."""
    runs = {}
    for kind, extra in (("sync", ["ray_init.num_cpus=1"]), ("decoupled", _async_args(*DECOUPLED_LOSS))):
        tmp_path = tmp_path_factory.mktemp(f"timeline_{kind}")
        _assert_ok(_run_cli(tmp_path, tiny_model_dir, *_reward_args(tmp_path), *ONE_WORKER, *extra))
        runs[kind] = tmp_path / "run"
    return runs


def _named_steps(run_dir, step: int) -> set[str]:
    """The named steps the trainer ran at ``step``, as timeline.jsonl has them (the whole ``step`` left out),
    each of them timed in metrics.jsonl too."""
    spans = [json.loads(line) for line in open(run_dir / TIMELINE_FILE, encoding="utf-8")]
    names = {s["name"] for s in spans if s["worker"] == "trainer" and s["step"] == step} - {"step"}
    rows = {r["step"]: r for r in map(json.loads, open(run_dir / "metrics.jsonl", encoding="utf-8"))}
    timed_as = {"wait_batch": "trainer_idle"}  # the decoupled trainer's wait is timed under its own name
    assert all(f"timing_s/{timed_as.get(name, name)}" in rows[step] for name in names)
    return names


def _watch(page, run_dir) -> None:
    page.fill("#watch-dir", str(run_dir))
    page.click("#watch")
    page.wait_for_function("(dir) => { const t = window.studioTimeline.state;"
                           " return t.data && t.data.run_dir == dir && t.drawn.length > 0; }", arg=str(run_dir.resolve()))


def _drawn(page) -> list[dict]:
    return page.evaluate("window.studioTimeline.state.drawn.map((b) => ({worker: b.worker, name: b.name, "
                         "step: b.step, depth: b.depth, x: b.x, w: b.w}))")


def _shoot(page, name: str) -> None:
    page.evaluate("document.querySelector('#timeline').scrollIntoView({block: 'center'})")
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.locator("#timeline").screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"))


def test_the_timeline_shows_every_named_step_of_a_step(page, finished_runs):  # noqa: F811 (the fixture)
    run = finished_runs["sync"]
    _watch(page, run)
    drawn = _drawn(page)
    assert {b["worker"] for b in drawn} == {"trainer"}
    for step in (1, 2):
        bars = [b for b in drawn if b["step"] == step]
        named = _named_steps(run, step)
        assert {"generate", "compute_reward", "compute_old_log_prob", "compute_advantage", "update_actor"} <= named
        assert {b["name"] for b in bars} == named, step  # "step" is drawn as boundaries, not a bar
        assert all(b["w"] >= 1 and b["depth"] == 0 for b in bars)
    legend = page.locator("#timeline-legend .timeline-name").all_inner_texts()
    assert set(legend) == _named_steps(run, 1) | _named_steps(run, 2)
    assert page.evaluate("window.studioTimeline.state.data.steps.map((s) => s.step)") == [1, 2]
    assert "steps 0\u20132 of 2" in page.locator("#timeline-info").inner_text()
    _shoot(page, "7_timeline_sync")
    _check_hover_and_drag(page, drawn)

    page.fill("#timeline-first", "2")  # zoom to step 2
    page.fill("#timeline-last", "2")
    page.click("#timeline-show")
    page.wait_for_function("window.studioTimeline.state.data.first == 2")
    assert {b["step"] for b in _drawn(page)} == {2}
    page.click("#timeline-follow")
    page.wait_for_function("window.studioTimeline.state.data.first == 0")


def _check_hover_and_drag(page, drawn) -> None:
    """Hovering a bar names it; dragging across the chart zooms into that stretch; a double-click zooms out."""
    box = page.locator("#timeline-canvas").bounding_box()
    bar = next(b for b in drawn if b["name"] == "update_actor" and b["step"] == 1)
    y = page.evaluate("window.studioTimeline.state.drawn.find((b) => b.name == 'update_actor').y") + 5
    page.mouse.move(box["x"] + bar["x"] + bar["w"] / 2, box["y"] + y)
    assert page.locator("#timeline-tip").inner_text().startswith("update_actor \u00b7 trainer \u00b7 step 1 \u00b7 ")
    page.mouse.move(box["x"] + bar["x"], box["y"] + y)  # drag across update_actor of step 1
    page.mouse.down()
    page.mouse.move(box["x"] + bar["x"] + bar["w"], box["y"] + y, steps=4)
    page.mouse.up()
    zoomed = page.evaluate("window.studioTimeline.state.drawn.find((b) => b.name == 'update_actor' && b.step == 1).w")
    assert zoomed > 0.9 * (box["width"] - 128)  # the bar now spans (almost) the whole plot
    page.mouse.dblclick(box["x"] + bar["x"], box["y"] + y)
    page.wait_for_function("window.studioTimeline.state.view === null")


def test_the_decoupled_producer_and_trainer_share_the_axis(page, finished_runs):  # noqa: F811 (the fixture)
    _watch(page, finished_runs["decoupled"])
    drawn = _drawn(page)
    lanes = page.evaluate("window.studioTimeline.state.data.lanes")
    assert lanes[:2] == ["trainer", "rollout"] and any(lane.startswith("reward/") for lane in lanes)
    step1 = {b["name"] for b in drawn if b["worker"] == "trainer" and b["step"] == 1}
    assert step1 == _named_steps(finished_runs["decoupled"], 1) and {"take_experiences", "wait_batch"} <= step1
    assert any(b["name"] == "wait_batch" and b["depth"] == 1 for b in drawn)  # inset in take_experiences
    generate = [b for b in drawn if b["worker"] == "rollout" and b["name"] == "generate"]
    work = [b for b in drawn if b["worker"] == "trainer" and b["name"] != "wait_batch"]
    assert any(g["x"] < t["x"] + t["w"] and t["x"] < g["x"] + g["w"] for g in generate for t in work)
    _shoot(page, "8_timeline_decoupled")
