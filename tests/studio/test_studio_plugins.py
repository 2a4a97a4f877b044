"""Plugin files: their registered names join the studio's choices, and a launched run imports them."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from hybrid_rl.algorithms import unregister_adv_est
from hybrid_rl.studio.plugins import load_plugin_files

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")

from hybrid_rl.studio.server import create_app  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402

NAME = "studio_plugin_grpo"
PLUGIN = f'''
from pathlib import Path

from hybrid_rl.algorithms.advantage import get_adv_estimator_fn, register_adv_est


@register_adv_est("{NAME}")
def estimator(**inputs):
    with open(Path(__file__).with_suffix(".calls"), "a") as f:  # the test sees the run called it
        f.write("called\\n")
    return get_adv_estimator_fn("grpo")(**inputs)
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN))
    yield path
    unregister_adv_est(NAME)
    sys.modules.pop("hybrid_rl_plugin_my_plugin", None)


def test_a_plugins_estimator_is_a_choice_and_passes_the_check(plugin, local_client):
    client = local_client(create_app(TOKEN, plugins=(str(plugin),)))
    fields = {f["key"]: f for f in client.get("/api/schema").json()["fields"]}
    assert NAME in fields["algorithm.adv_estimator"]["choices"]
    assert client.post("/api/check", json={"values": {"algorithm.adv_estimator": NAME}}).json() == {"errors": {}}
    load_plugin_files([str(plugin)])  # a second load is a no-op, not a duplicate registration


def test_a_missing_or_failing_plugin_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_plugin_files([str(tmp_path / "nope.py")])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="failed to import: RuntimeError: boom"):
        load_plugin_files([str(broken)])


@pytest.mark.slow
def test_a_run_launched_with_a_plugin_estimator_uses_it(plugin, tmp_path, tiny_model_dir, monkeypatch, local_client):
    from tests.studio.test_studio_runs import _tiny_run, _wait

    monkeypatch.chdir(tmp_path)
    client = local_client(create_app(TOKEN, roots=(tiny_model_dir,), plugins=(str(plugin),)))
    values = {**_tiny_run(tmp_path, tiny_model_dir, steps=2), "algorithm.adv_estimator": NAME}
    out = client.post("/api/runs", json={"values": values}).json()
    assert out["errors"] == {}
    state = _wait(client, out["id"], lambda s: not s["running"])
    assert state["returncode"] == 0, (tmp_path / "run" / "studio_console.log").read_text()[-3000:]
    assert plugin.with_suffix(".calls").read_text().count("called") == 2  # one advantage pass a step
