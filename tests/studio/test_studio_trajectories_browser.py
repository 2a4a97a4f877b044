"""The trajectory viewer in a real browser (headless Chromium via Playwright, as test_studio_browser.py).

A 2-step run launched from the studio with both dump keys (the tiny test model; the embedded one when
``HYBRID_RL_STUDIO_SCREENSHOTS=DIR`` asks for screenshots) is opened in the viewer: a group lists its
``rollout.n`` responses whose advantages are GRPO's, and the token view colours by log-prob gap. A
multi-turn dump (tests/studio/trajectory_dumps.py) shows its tool observation in the tool colour, and
a step dumped while the page is open is followed.
Skipped, saying why, where Playwright or a system Chromium is missing.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from installed import import_installed

from tests.studio.conftest import TOKEN
# the browser tests' skip rule (Chromium, Playwright), screenshot folder and studio server
from tests.studio.test_studio_browser import CHROMIUM, SCREENSHOTS, serving_studio, sync_api
from tests.studio.trajectory_dumps import write_step

httpx = import_installed("httpx", "studio")

pytestmark = pytest.mark.slow
N = 4
"""Responses per prompt (``rollout.n``)."""
TOOL_COLOUR = "rgb(252, 232, 178)"
"""``--tool`` of static/trajectories.css."""
PAGE_ERRORS: list[str] = []
"""Uncaught errors of the page's scripts (each test ends with none)."""
SCORER = ("def partial(data_source, solution_str, ground_truth, extra_info=None):\n"
          "    return 1.0 if str(ground_truth) in solution_str else (len(solution_str) % 3) / 4\n")


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """``(url, cwd)`` of a studio serving the session's temporary folders."""
    with serving_studio(tmp_path_factory, "trajectory_studio") as served:
        yield served


def _launch(url: str, values: dict) -> dict:
    """Launch a run as the page does (confirming its reward file) and wait for its end; its last state."""
    headers = {"X-Studio-Token": TOKEN}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        answer = client.post("/api/runs", json={"values": values}).json()
        assert answer.get("confirm"), answer
        confirmed = [c["path"] for c in answer["confirm"]]
        answer = client.post("/api/runs", json={"values": values, "confirm_code": confirmed})
        run_id = answer.json()["id"]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            state = client.get(f"/api/runs/{run_id}").json()
            if not state["running"]:
                return state
            time.sleep(1)
    raise AssertionError("the run did not finish in 15 minutes")


@pytest.fixture(scope="module")
def finished_run(studio, tiny_model_dir):
    """A 2-step GRPO run launched from the studio, dumping every step (training and validation)."""
    url, cwd = studio
    (cwd / "partial.py").write_text(SCORER)
    values = {"trainer.default_local_dir": "run", "trainer.rollout_data_dir": "run/dumps/train",
              "trainer.validation_data_dir": "run/dumps/val", "trainer.total_training_steps": "2",
              "data.train_batch_size": "2", "actor_rollout_ref.rollout.n": str(N),
              "actor_rollout_ref.actor.ppo_mini_batch_size": "1",  # two updates a step: the old log-probs are computed
              "actor_rollout_ref.rollout.calculate_log_probs": True,  # the rollout's log-probs too: their gap
              "custom_reward_function.path": "partial.py", "custom_reward_function.name": "partial",
              "data.arithmetic.cache_dir": "data", "data.arithmetic.num_train": "8", "data.arithmetic.num_test": "2",
              "data.arithmetic.num_shots": "0", "trainer.save_freq": "-1", "actor_rollout_ref.rollout.name": "hf"}
    values.update({"data.max_response_length": "48"} if SCREENSHOTS else {
        "actor_rollout_ref.model.path": tiny_model_dir, "data.max_response_length": "12"})
    state = _launch(url, values)
    assert state["returncode"] == 0, state["console"]
    return cwd / "run"


@pytest.fixture(scope="module")
def page(studio):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: PAGE_ERRORS.append(str(error)))
        page.goto(f"{studio[0]}/?token={TOKEN}")
        page.wait_for_selector("#traj-open")
        # the form's first check has answered: Hydra composes one config at a time (no request races it)
        page.wait_for_function("[...document.querySelectorAll('[data-path-for]')].some((e) => e.dataset.state)")
        yield page
        browser.close()


def _shot(page, name: str, selector: str = "#trajectories") -> None:
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.locator(selector).screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"))


def _open(page, folder) -> None:
    page.fill("#traj-run", str(folder))
    page.click("#traj-open")
    page.wait_for_function("document.querySelectorAll('.traj-card').length > 0")


def _grpo(scores: list[float]) -> list[float]:
    """GRPO's advantages of one group, by hand: (score - mean) / (unbiased std + 1e-6)."""
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / (len(scores) - 1)) ** 0.5
    return [(s - mean) / (std + 1e-6) for s in scores]


def test_a_group_shows_its_responses_with_grpos_advantages(finished_run, page):
    _open(page, finished_run)
    assert page.locator("#traj-folder option").all_inner_texts() == ["train", "val"]
    assert page.locator("#traj-step option").all_inner_texts() == ["1", "2"]
    assert page.input_value("#traj-step") == "2"  # following the run: its newest step
    groups = page.locator("#traj-group-table tbody tr")
    assert groups.count() == 2  # data.train_batch_size prompts
    varied = None
    for i in range(groups.count()):  # every group: n responses, advantages as GRPO computes them from the scores
        groups.nth(i).click()
        page.wait_for_function(f"trajectoryState.group && trajectoryState.group.uid == "
                               f"{json.dumps(groups.nth(i).get_attribute('data-uid'))}")
        cards = page.locator(".traj-card")
        assert cards.count() == N
        rows = page.evaluate("trajectoryState.group.rows.map((r) => [r.score, r.advantage])")
        shown = [float(a) for a in cards.locator("[data-advantage]").evaluate_all(
            "els => els.map((e) => e.dataset.advantage)")]
        assert sorted(shown) == pytest.approx(sorted(a for _, a in rows), abs=1e-12)
        assert sum(shown) == pytest.approx(0.0, abs=1e-4)
        if len({s for s, _ in rows}) > 1:
            assert [a for _, a in rows] == pytest.approx(_grpo([s for s, _ in rows]), abs=1e-4)
            varied = i
    assert varied is not None, "no group with different scores: the check above never ran"
    groups.nth(varied).click()
    page.wait_for_function("document.querySelectorAll('.traj-card.chosen').length == 1")
    _shot(page, "trajectories_1_group")
    page.select_option("#traj-sort", "reward")  # lowest reward first
    scores = page.evaluate("[...document.querySelectorAll('.traj-card')].map((c) => "
                           "trajectoryState.group.rows.find((r) => r.row == c.dataset.row).score)")
    assert scores == sorted(scores)
    page.select_option("#traj-sort", "order")
    assert PAGE_ERRORS == []


def test_the_token_view_colours_by_the_log_prob_gap(finished_run, page):
    _open(page, finished_run)
    page.locator(".traj-card").nth(1).click()
    page.wait_for_function("document.querySelector('.traj-card:nth-child(2)').classList.contains('chosen')")
    tokens = page.locator("#traj-tokens .tok")
    row = page.evaluate("trajectoryState.group.rows[1]")
    assert tokens.count() == row["length"] and "".join(tokens.all_text_contents()) == "".join(row["pieces"])
    assert page.locator("#traj-modes input[value=gap]").is_enabled()
    page.check("#traj-modes input[value=gap]")
    gaps = [g for g in row["values"]["gap"] if g is not None]
    assert len(gaps) == row["model_tokens"]
    colours = tokens.evaluate_all("els => els.map((e) => e.style.backgroundColor)")
    biggest = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
    assert abs(gaps[biggest]) > 0  # the rollout's forward pass is not the trainer's: the mismatch is real
    # the row's largest gap is drawn at full strength, red below, blue above (every token here is the model's)
    assert colours[biggest] == ("rgb(26, 115, 232)" if gaps[biggest] > 0 else "rgb(217, 48, 37)")
    _shot(page, "trajectories_3_gap")
    assert page.locator("#traj-modes input[value=entropy]").is_enabled()  # the run's entropys reached the dump
    page.check("#traj-modes input[value=entropy]")
    assert page.locator("#traj-legend").inner_text().startswith("white: 0, purple")
    assert PAGE_ERRORS == []


def test_a_masked_observation_is_drawn_in_the_tool_colour(page, studio, tiny_model_dir):
    from transformers import AutoTokenizer

    agent = studio[1] / "agent_run"
    write_step(agent / "dumps", AutoTokenizer.from_pretrained(tiny_model_dir), 1)
    meta = {"config": {"actor_rollout_ref": {"model": {"path": tiny_model_dir}}}}  # as trainer.dump_replay_batch writes
    (agent / "dumps" / "meta.json").write_text(json.dumps(meta))
    _open(page, agent)
    page.locator("#traj-group-table tbody tr[data-uid=calc]").click()
    page.wait_for_function("trajectoryState.group.uid == 'calc'")
    page.locator(".traj-card").first.click()
    page.check("#traj-modes input[value=mask]")
    observation = page.locator("#traj-tokens .tok[data-role=tool]")
    assert observation.count() == 53  # "\n<|im_start|>tool\n<tool_response>42</tool_response>..." byte by byte
    assert observation.first.evaluate("e => getComputedStyle(e).backgroundColor") == TOOL_COLOUR
    model = page.locator("#traj-tokens .tok[data-role=model]").first
    assert model.evaluate("e => getComputedStyle(e).backgroundColor") != TOOL_COLOUR
    assert page.locator("#traj-turns .turn").evaluate_all("els => els.map((e) => e.dataset.role)") == [
        "model", "tool", "model"]
    assert page.locator("#traj-turns .call").inner_text() == 'tool call calculator({"expression":"6*7"})'
    _shot(page, "trajectories_2_mask_multi_turn")
    page.locator(".traj-card").nth(1).click()  # the corrected row: an environment's user turn
    page.wait_for_function("document.querySelectorAll('#traj-tokens .tok[data-role=environment]').length > 0")
    write_step(agent / "dumps", AutoTokenizer.from_pretrained(tiny_model_dir), 2)  # the run goes on: a new step
    page.wait_for_function("document.querySelector('#traj-step').value == '2' && trajectoryState.group"
                           " && trajectoryState.group.step == 2", timeout=20_000)  # followed within 5 s
    assert page.locator("#traj-step option").all_inner_texts() == ["1", "2"]
    assert PAGE_ERRORS == []
