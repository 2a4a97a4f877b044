"""What a request can make the studio read, import or write (issue 59's review): no check imports a model
folder's code, every folder a trust_remote_code loads is confirmed, the run folder and every path a check
looks at lie inside the studio's folders, and a launch's config is private and alone."""

from __future__ import annotations

import json
import shutil
import stat

import pytest

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")

from hybrid_rl.studio import runs  # noqa: E402
from hybrid_rl.studio.form import changed_values  # noqa: E402
from hybrid_rl.studio.schema import config_schema  # noqa: E402
from hybrid_rl.studio.server import create_app, typed_values  # noqa: E402
from hybrid_rl.studio.workspace import REMOTE_CODE_FOLDERS, Workspace, code_paths  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402

ACTOR_CODE = {"actor_rollout_ref.model.trust_remote_code": True}


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The studio's working folder (the tests' cwd while the app is built)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _code_folder(model_dir, folder, marker):
    """A copy of ``model_dir`` whose config.json and tokenizer_config.json name modules of its own
    (``auto_map``); importing either writes ``marker``."""
    shutil.copytree(model_dir, folder)
    for module, base, name, entry in (("evil_cfg", "LlamaConfig", "config.json", {"AutoConfig": "evil_cfg.Evil"}),
                                      ("evil_tok", "PreTrainedTokenizerFast", "tokenizer_config.json",
                                       {"AutoTokenizer": ["evil_tok.Evil", None]})):
        (folder / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
                                             f"from transformers import {base}\nclass Evil({base}):\n    pass\n")
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**data, "auto_map": entry}))
    return folder


def test_check_never_imports_a_model_folders_code(work, local_client, tiny_model_dir):
    marker = work / "IMPORTED"
    evil = _code_folder(tiny_model_dir, work / "evil", marker)
    shutil.copytree(tiny_model_dir, work / "student")
    client = local_client(create_app(TOKEN))
    for values in ({"actor_rollout_ref.model.path": "student", "distillation.enabled": True,
                    "distillation.teacher_models": f"{{teacher_model: {{model_path: {evil}}}}}"},
                   {"actor_rollout_ref.model.path": str(evil), "data.tokenizer": str(evil)}):
        answer = client.post("/api/check", json={"values": {**values, **ACTOR_CODE}}).json()
        assert answer["errors"] == {}, answer
    assert not marker.exists()


def _listed(values, work):
    typed, errors = typed_values(values)
    assert errors == {}
    plan = runs.RunLauncher(cwd=str(work)).plan(changed_values(typed))
    return {(c.key, c.path) for c in code_paths(plan.config, Workspace([str(work)]))}


@pytest.mark.parametrize("values, key", [
    ({"data.tokenizer": "tok", **ACTOR_CODE}, "data.tokenizer"),
    ({"actor_rollout_ref.model.tokenizer_path": "tok", **ACTOR_CODE}, "actor_rollout_ref.model.tokenizer_path"),
    ({"critic.model.tokenizer_path": "tok", "critic.model.trust_remote_code": True}, "critic.model.tokenizer_path"),
    ({"reward_model.model.input_tokenizer": "tok", "reward_model.model.trust_remote_code": True},
     "reward_model.model.input_tokenizer"),
    ({"distillation.teacher_models": "{t: {model_path: tok}}", **ACTOR_CODE},
     "distillation.teacher_models.t.model_path"),
    ({"actor_rollout_ref.model.path": "tok", **ACTOR_CODE}, "actor_rollout_ref.model.path"),
    ({"reward_model.model.path": "tok", "reward_model.model.trust_remote_code": True}, "reward_model.model.path"),
])
def test_every_folder_a_trust_remote_code_loads_is_listed(work, values, key):
    """The embedded model's id (the default actor path) is the package's own; the folder beside it is not."""
    assert _listed(values, work) == {(key, str(work / "tok"))}


def test_no_folder_is_listed_without_trust_remote_code_and_every_flag_is_known(work):
    assert _listed({"data.tokenizer": "tok", "actor_rollout_ref.model.tokenizer_path": "tok"}, work) == set()
    fields = {f.key: f for f in config_schema()[0]}
    assert {k for k in fields if k.endswith(".trust_remote_code")} == set(REMOTE_CODE_FOLDERS)
    loaded = {p for patterns in REMOTE_CODE_FOLDERS.values() for p in patterns}
    models = {k for k, f in fields.items() if f.path_role == "model"}
    assert models <= loaded  # a new model or tokenizer key must say which flag loads it


def test_a_run_folder_outside_the_studios_folders_is_refused(work, local_client, tmp_path_factory, monkeypatch):
    outside = tmp_path_factory.mktemp("outside_home")
    (outside / ".bashrc").write_text("secret\n")
    (work / "link").symlink_to(outside)
    started = []
    monkeypatch.setattr(runs.RunLauncher, "_start", lambda self, run_dir, values: started.append(run_dir) or 1)
    client = local_client(create_app(TOKEN))
    for run_dir in (str(outside / "run"), "link/run", "../x"):
        response = client.post("/api/runs", json={"values": {"trainer.default_local_dir": run_dir}})
        assert response.status_code in (400, 403), run_dir
        assert "outside the studio's folders" in response.json()["errors"]["trainer.default_local_dir"]
    assert started == [] and not (outside / "run").exists()
    later = client.post("/api/paths", json={"values": {"data.train_files": str(outside / ".bashrc")}})
    assert later.status_code == 403  # a refused launch opened nothing


def test_a_run_folder_the_check_passes_is_still_judged_resolved(work, local_client, tmp_path_factory, monkeypatch):
    """The launch judges the composed, resolved run folder itself (a check the confiner missed)."""
    outside = tmp_path_factory.mktemp("outside_run")
    monkeypatch.setattr("hybrid_rl.studio.server._confiner", lambda workspace: None)
    monkeypatch.setattr(runs.RunLauncher, "_start", lambda self, run_dir, values: 1)
    client = local_client(create_app(TOKEN))
    response = client.post("/api/runs", json={"values": {"trainer.default_local_dir": str(outside)}})
    assert response.status_code == 403
    assert "outside the studio's folders" in response.json()["errors"]["trainer.default_local_dir"]


@pytest.mark.parametrize("key, text", [
    ("data.tokenizer", "{}"), ("trainer.resume_from_path", "{}"), ("actor_rollout_ref.model.path", "{}"),
    ("data.train_files", "{}"), ("reward_model.model.input_tokenizer", "{}"),
    ("distillation.teacher_models", "{{t: {{model_path: {}}}}}"), ("async_training.buffer.path", "sqlite:///{}"),
])
def test_check_answers_nothing_about_a_path_outside(work, local_client, tmp_path_factory, key, text):
    """An existing file, an existing folder and a missing path outside all get the same refusal."""
    outside = tmp_path_factory.mktemp("outside_check")
    (outside / "file").write_text("x")
    client = local_client(create_app(TOKEN))
    answers = []
    for path in (outside / "file", outside, outside / "missing"):
        values = {key: text.format(path)}
        if key.startswith("distillation"):
            values["distillation.enabled"] = True
        errors = client.post("/api/check", json={"values": values}).json()["errors"]
        assert list(errors) == [key] and "outside the studio's folders" in errors[key], errors
        answers.append(errors[key].replace(str(path), "PATH"))
    assert len(set(answers)) == 1


def test_a_launch_writes_its_config_private_and_reads_it_alone(tmp_path, monkeypatch):
    """0600 (it may hold a password); a schema YAML left in the run folder or a link named like the
    config changes nothing the run reads."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ppo_trainer_schema.yaml").write_text("trainer: {total_training_steps: 99}\n")
    (run_dir / runs.CONSOLE_LOG).symlink_to(tmp_path / "elsewhere.log")
    commands = []
    monkeypatch.setattr(runs.subprocess, "Popen", lambda command, **kwargs: commands.append(command))
    launcher = runs.RunLauncher(cwd=str(tmp_path))
    plan = launcher.plan({"trainer.default_local_dir": str(run_dir)})
    with pytest.raises(ValueError, match="cannot write the run folder"):  # the console log is a link: refused
        launcher.launch(plan, {"trainer.default_local_dir": str(run_dir)})
    assert not (tmp_path / "elsewhere.log").exists()
    (run_dir / runs.CONSOLE_LOG).unlink()
    launcher.launch(plan, {"trainer.default_local_dir": str(run_dir)})
    (command,) = commands
    config_dir = command[command.index("--config-path") + 1]
    assert config_dir != str(run_dir) and config_dir.startswith(str(run_dir / runs.LAUNCH_DIR_PREFIX))
    assert sorted(p.name for p in (run_dir / config_dir).iterdir()) == [f"{runs.CONFIG_NAME}.yaml"]
    for config in (run_dir / f"{runs.CONFIG_NAME}.yaml", run_dir / config_dir / f"{runs.CONFIG_NAME}.yaml"):
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE((run_dir / config_dir).stat().st_mode) == 0o700


def test_a_host_header_that_is_no_host_and_port_is_refused(work, local_client):
    client = local_client(create_app(TOKEN))
    for host in ("127.0.0.1:18931@evil.com", "127.0.0.1@evil.com", "localhost:1:2", "127.0.0.1 evil.com"):
        response = client.get("/api/schema", headers={"host": host})
        assert response.status_code == 403 and "is not served" in response.json()["error"], host
    assert client.get("/api/schema", headers={"host": "127.0.0.1:18931"}).status_code == 200
