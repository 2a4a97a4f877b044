"""The studio in a real browser: headless Chromium from the system's packages, driven by Playwright.

Skipped, with the reason printed, where Playwright or a system Chromium is missing
(``bash scripts/install.sh --test`` installs both where it can). ``HYBRID_RL_STUDIO_SCREENSHOTS=DIR``
saves a screenshot of each stage (``docs/studio/`` holds the committed ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from installed import import_installed, require_installed

from hybrid_rl.studio.schema import BEGINNER_KEYS, config_schema
from tests.studio.conftest import TOKEN
from hybrid_rl.trainer.config.loader import to_ppo_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
require_installed("chromium", None if CHROMIUM else "no chromium on PATH (apt-get install chromium)")
sync_api = import_installed("playwright.sync_api", "test tools")
uvicorn = import_installed("uvicorn", "studio")

pytestmark = pytest.mark.slow
SCREENSHOTS = os.path.abspath(os.environ["HYBRID_RL_STUDIO_SCREENSHOTS"]) if os.environ.get(
    "HYBRID_RL_STUDIO_SCREENSHOTS") else None  # resolved before the test changes directory


@contextlib.contextmanager
def serving_studio(tmp_path_factory, cwd_name: str):
    """``(url, cwd)`` of a studio served on a free loopback port from a thread, its working directory a
    new temporary folder ``cwd_name`` (launched runs start there: Hydra writes main_ppo.log there) and its
    folders the session's temporary ones (a test's run folder, the tiny model)."""
    from hybrid_rl.studio.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home, cwd = os.getcwd(), tmp_path_factory.mktemp(cwd_name)
    os.chdir(cwd)
    app = create_app(TOKEN, roots=(str(tmp_path_factory.getbasetemp()),), port=port)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", cwd
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        os.chdir(home)


@pytest.fixture(scope="module")
def studio_url(tmp_path_factory):
    with serving_studio(tmp_path_factory, "studio_cwd") as (url, _):
        yield url


@pytest.fixture(scope="module")
def page(studio_url):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(studio_url)  # without the token: the page loads, the API refuses, the page says why
        page.wait_for_function("document.querySelector('#access-error').textContent != ''")
        assert "needs the studio's token" in page.locator("#access-error").inner_text()
        assert page.locator("[data-error-for]").count() == 0
        page.goto(f"{studio_url}/?token={TOKEN}")  # the URL the studio prints: sets the cookie, drops the token
        assert page.url == studio_url + "/"
        page.wait_for_selector("[data-error-for]", state="attached")
        yield page
        browser.close()


def _shot(page, name: str) -> None:
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=False)


def _field(key: str) -> str:
    return "#f-" + key.replace(".", "--")


def _error(page, key: str) -> str:
    return page.locator(f'[data-error-for="{key}"]').inner_text()


def _check_widgets(page) -> None:
    """In the expert view: widgets by type, human labels with the key small, rendered help."""
    assert page.locator(_field("trainer.val_before_train")).get_attribute("type") == "checkbox"
    assert page.locator(_field("data.train_batch_size")).get_attribute("type") == "number"
    assert page.locator(_field("algorithm.adv_estimator")).evaluate("el => el.tagName") == "SELECT"
    assert page.locator(f'{_field("actor_rollout_ref.actor.optim.betas")} input.item').count() == 2  # a list editor
    page.locator('[data-section="actor_rollout_ref.actor"] > summary').click()  # a collapsed section opens
    grad_clip = _field("actor_rollout_ref.actor.grad_clip")
    none = page.locator("#none-" + grad_clip[3:])  # an optional field's "none" toggle
    none.check()
    assert page.locator(grad_clip).is_disabled()
    none.uncheck()
    keys = _field("algorithm.gdpo_reward_keys")  # an optional list: items survive "none" on and off
    page.locator("#none-" + keys[3:]).uncheck()
    page.click(f"{keys} button.add")
    page.fill(f"{keys} input.item", "correct format")
    page.locator("#none-" + keys[3:]).check()
    assert page.evaluate("texts['algorithm.gdpo_reward_keys']") == "null"
    page.locator("#none-" + keys[3:]).uncheck()
    assert page.evaluate("texts['algorithm.gdpo_reward_keys']") == "['correct format']"
    page.locator("#none-" + keys[3:]).check()
    row = page.locator('[data-field="data.train_batch_size"]')
    assert row.locator(".label").inner_text() == "Train batch size"
    assert row.locator(".key").inner_text() == "data.train_batch_size"
    assert page.locator(".help code").count() > 10  # ``literals`` rendered as code, not shown raw
    assert "``" not in page.locator("#form").inner_text()
    top_p = page.locator(_field("actor_rollout_ref.rollout.top_p"))  # the declared range on the input
    assert (top_p.get_attribute("min"), top_p.get_attribute("max")) == ("0", "1")
    assert page.locator('[data-range-for="actor_rollout_ref.rollout.top_p"]').text_content() == "in (0, 1]"  # folded
    page.wait_for_function("document.querySelector('[data-path-for=\"actor_rollout_ref.model.path\"]').dataset.state == 'ok'")


def test_views_errors_export_launch_and_the_reward_curve(page, tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    assert page.locator("[data-error-for]").count() == len(BEGINNER_KEYS)
    _shot(page, "1_beginner")
    page.check("input[name=view][value=expert]")
    page.wait_for_function(f"document.querySelectorAll('[data-error-for]').length == {len(config_schema()[0])}")
    _shot(page, "2_expert")
    _check_widgets(page)
    page.check("input[name=view][value=beginner]")
    page.wait_for_selector(_field("data.train_batch_size"))

    _check_bad_number(page)
    _check_path_states(page, tmp_path)
    _shot(page, "3_invalid")
    page.fill(_field("data.train_files"), "")

    default = next(f.default for f in config_schema()[0] if f.key == "data.train_batch_size")
    page.fill(_field("data.train_batch_size"), str(default))  # fixed in the field: the message goes
    page.wait_for_function("document.querySelector('[data-error-for=\"data.train_batch_size\"]').textContent == ''"
                           " && !document.querySelector('#export').disabled")

    _check_code_confirmation(page, tmp_path)
    run_dir = tmp_path / "run"
    small = (f"data.train_batch_size=4 actor_rollout_ref.rollout.n=2 "
             f"actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.total_training_steps=2 "
             f"trainer.val_before_train=false data.arithmetic.cache_dir={tmp_path}/data "
             f"trainer.default_local_dir={run_dir}")
    if not SCREENSHOTS:  # the tiny test model: the launch, not the model, is under test (~25 s less)
        small += (f" actor_rollout_ref.model.path={tiny_model_dir} actor_rollout_ref.rollout.name=hf"
                  " data.arithmetic.num_shots=0 data.arithmetic.num_train=16 data.arithmetic.num_test=4"
                  " data.max_response_length=8")
    page.fill("#import-text", small)  # a small run's settings, loaded as a command line
    page.click("#import-command")
    page.wait_for_function("document.querySelector('[data-error-for=\"data.train_batch_size\"]').textContent == ''"
                           " && !document.querySelector('#export').disabled")
    _check_export(page, tmp_path)

    page.click("#launch")  # 2 steps (the embedded model for the screenshots)
    page.wait_for_function("document.querySelector('#run-state').textContent.startsWith('finished')",
                           timeout=600_000)
    assert "finished (exit 0) \u00b7 step 2 of 2" in page.locator("#run-state").inner_text()
    page.wait_for_function("window.studioCharts['Reward'] && window.studioCharts['Reward'].data[0].length == 2")
    page.evaluate("document.querySelector('#run-state').scrollIntoView({block: 'start'})")
    _shot(page, "5_run")
    reward = _chart(page, "Reward")
    assert reward["axes"] == ["step", "score"] and reward["series"] == ["critic/score/mean"]
    assert reward["steps"] == [1, 2] and "critic/score/mean" in reward["legend"]
    assert _chart(page, "Step time")["axes"] == ["step", "seconds"]
    assert page.locator("#samples th").all_inner_texts() == ["step", "prompt", "response", "score"]
    assert yaml.safe_load((run_dir / "studio_config.yaml").read_text())["trainer"]["total_training_steps"] == 2

    _check_overlay(page, tmp_path, run_dir)


def _check_bad_number(page) -> None:
    """A number input refuses text; a number out of range gets the CLI's message and disables Export."""
    with pytest.raises(sync_api.Error, match="Cannot type text into input\\[type=number\\]"):
        page.fill(_field("data.train_batch_size"), "abc")  # a number input refuses text
    batch = page.locator(_field("data.train_batch_size"))
    assert batch.get_attribute("min") == "1" and batch.get_attribute("max") is None
    assert page.locator('[data-range-for="data.train_batch_size"]').inner_text() == "\u2265 1"
    page.fill(_field("data.train_batch_size"), "0")  # a bad number: the CLI's message beside the field
    page.wait_for_function("document.querySelector('[data-error-for=\"data.train_batch_size\"]').textContent != ''")
    assert "data.train_batch_size=0 is invalid: must be >= 1" in _error(page, "data.train_batch_size")
    assert batch.evaluate("el => el.validity.rangeUnderflow")  # the browser marks it below the range too
    assert page.locator("#export").is_disabled()


def _check_path_states(page, tmp_path) -> None:
    """A path field says whether what it names exists; one outside the studio's folders is refused."""
    page.fill(_field("data.train_files"), f"{tmp_path}/no/such/train.parquet")  # a path field says what it finds
    page.wait_for_function("document.querySelector('[data-path-for=\"data.train_files\"]').dataset.state == 'missing'")
    assert "does not exist" in page.locator('[data-path-for="data.train_files"]').inner_text()
    page.fill(_field("data.train_files"), "/etc/train.parquet")  # outside the studio's folders: not looked at
    page.wait_for_function("document.querySelector('[data-path-for=\"data.train_files\"]').dataset.state == 'refused'")
    assert "outside the studio's folders" in page.locator('[data-path-for="data.train_files"]').inner_text()
    page.fill(_field("data.train_files"), f"{tmp_path}/no/such/train.parquet")
    page.wait_for_function("document.querySelector('[data-path-for=\"data.train_files\"]').dataset.state == 'missing'")


def _check_export(page, tmp_path) -> None:
    """Export shows the YAML and command line; the downloaded YAML composes as main_ppo's --config-name."""
    page.click("#export")
    page.wait_for_function("document.querySelector('#yaml').textContent.length > 0")
    _shot(page, "4_exported")
    with page.expect_download() as download:  # the YAML as a file, as a user saves it
        page.click("#download")
    download.value.save_as(tmp_path / "exported.yaml")
    assert "trainer.total_training_steps=2" in page.locator("#command").inner_text()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):  # main_ppo --config-path/-name
        assert to_ppo_config(compose(config_name="exported")).data.train_batch_size == 4


def _check_code_confirmation(page, tmp_path) -> None:
    """A launch that runs a reward file asks first, naming the file; declining launches nothing."""
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    page.fill("#import-text", f"custom_reward_function.path={reward}")
    page.click("#import-command")
    page.wait_for_function("texts['custom_reward_function.path'] !== undefined"
                           " && !document.querySelector('#launch').disabled")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#launch")
    deadline = time.monotonic() + 60
    while not asked and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert asked and str(reward) in asked[0] and "custom_reward_function.path" in asked[0]
    assert page.locator("#run-state").inner_text() == ""  # declined: nothing launched


def _check_overlay(page, tmp_path, run_dir) -> None:
    """Two runs of one folder, overlaid: the run and a copy with other rewards."""
    other = tmp_path / "run_b"
    other.mkdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if "critic/score/mean" in row:
            row["critic/score/mean"] = 0.5 + row["step"] / 10
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page.fill("#watch-dir", str(tmp_path))
    page.click("#watch")
    page.wait_for_function("document.querySelector('#run-state').textContent.includes('2 runs overlaid')")
    assert page.locator("#run-state").inner_text().startswith("run: watching")
    page.wait_for_function("window.studioCharts['Reward'].series.length == 3")
    overlay = _chart(page, "Reward")
    assert overlay["series"] == ["run \u00b7 critic/score/mean", "run_b \u00b7 critic/score/mean"]
    assert overlay["data"][2] == [0.6, 0.7]
    # past the palette's 8 colours the lines are dashed: no two of 32 series alike
    styles = page.evaluate("[...Array(32).keys()].map((i) => JSON.stringify(seriesStyle(i)))")
    assert len(set(styles)) == 32 and "dash" not in styles[0] and '"dash"' in styles[8]
    page.evaluate("document.querySelector('#run-state').scrollIntoView({block: 'start'})")
    _shot(page, "6_compare")


def _chart(page, title: str) -> dict:
    """A drawn chart's axis labels, series, steps, data and legend text (uPlot draws on a canvas)."""
    return page.evaluate("""(title) => {
        const u = window.studioCharts[title];
        return {axes: u.axes.map((a) => a.label), series: u.series.slice(1).map((s) => s.label),
                steps: u.data[0], data: u.data, legend: u.root.querySelector('.u-legend').innerText};
    }""", title)
