"""A database password given to a run appears nowhere: no console line (stdout and stderr, Hydra's
"Error executing job with overrides" echo included), no file of the run folder or the working folder
(``logs/driver.log``, ``metrics.jsonl``, Hydra's files), no tracker payload (W&B's and SwanLab's
config, MLflow's params: the trackers are stand-ins that record what they are given). Each check also
finds the redacted URL where the real one would have been, so that it cannot pass by printing nothing.
"""

import importlib.machinery
import importlib.util
import json
import os
import sys
import types

import pytest

from hybrid_rl.trainer import main_ppo
from hybrid_rl.trainer.config.loader import get_config, to_container, to_ppo_config
from hybrid_rl.trainer.core.tracking import Tracking
from tests.trainer.test_e2e import REPO, _run_cli

PASSWORD = "Hunter2-s3cret"
URL = f"postgresql+psycopg://alice:{PASSWORD}@127.0.0.1:1/rl"  # nothing listens on port 1
SHOWN = "postgresql+psycopg://alice:***@127.0.0.1:1/rl"
SQL_BUFFER = ["async_training.enable=true", "async_training.max_head_offpolicyness=0",
              "async_training.buffer.storage_type=sql", "actor_rollout_ref.rollout.calculate_log_probs=true"]
TRACKERS = ("wandb", "mlflow", "swanlab")
FAKE_TRACKER = '''
import json, os

def _record(*call):
    with open(os.environ["FAKE_TRACKER_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps(call, default=str) + "\\n")

init = lambda **kw: _record("init", kw)
log = lambda data, step=None: _record("log", data, step)
finish = lambda: _record("finish")
set_experiment = lambda name: _record("set_experiment", name)
start_run = lambda run_name=None: _record("start_run", run_name)
log_params = lambda params: _record("log_params", params)
log_metrics = lambda metrics, step=None: _record("log_metrics", metrics, step)
end_run = lambda: _record("end_run")
'''


def _files_with_password(folder) -> list[str]:
    """Every file under ``folder`` whose bytes hold the password."""
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                if PASSWORD.encode() in f.read():
                    found.append(path)
    return found


def _fake_trackers(folder, monkeypatch=None) -> str:
    """``wandb``, ``mlflow`` and ``swanlab`` modules in ``folder`` that append each call to
    ``$FAKE_TRACKER_LOG``; imported in this process too when ``monkeypatch`` is given."""
    os.makedirs(folder, exist_ok=True)
    for name in TRACKERS:
        with open(os.path.join(folder, f"{name}.py"), "w", encoding="utf-8") as f:
            f.write(FAKE_TRACKER)
    for name in TRACKERS if monkeypatch else ():
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, name, module)
    return str(folder)


def test_tracker_payloads_hold_the_url_redacted(tmp_path, monkeypatch, caplog):
    log = tmp_path / "trackers.jsonl"
    monkeypatch.setenv("FAKE_TRACKER_LOG", str(log))
    _fake_trackers(tmp_path / "fake", monkeypatch)
    config = to_container(to_ppo_config(get_config([*SQL_BUFFER, f"async_training.buffer.path={URL}"])))
    backends = ["console", "jsonl", *TRACKERS] + (["tensorboard"] if importlib.util.find_spec("tensorboard") else [])
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="hybrid_rl.trainer.core.tracking"):
        tracker = Tracking("p", "e", backends, str(run), config=config)
        tracker.log({"critic/score/mean": 0.5}, step=1)
        tracker.finish()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    configs = [args[0]["config"] for name, *args in calls if name == "init"]  # W&B's and SwanLab's
    assert len(configs) == 2 and all(c["async_training"]["buffer"]["path"] == SHOWN for c in configs)
    (params,) = [args[0] for name, *args in calls if name == "log_params"]
    assert params["async_training.buffer.path"] == SHOWN
    assert PASSWORD not in log.read_text() and PASSWORD not in caplog.text and "step:1" in caplog.text
    assert config["async_training"]["buffer"]["path"] == URL  # the run itself keeps the real URL
    assert (run / "metrics.jsonl").is_file() and not _files_with_password(run)


@pytest.mark.parametrize("password", ["Pw LEAK", "Pw'LEAK", "Pw@LEAK", "Pw:LEAK"])
def test_the_decoupled_trainers_error_text_hides_any_password(password):
    """``_buffer_where`` names the buffer in resume errors: a whole URL, so make_url's password (or
    everything up to the last '@') is hidden whatever it holds."""
    from types import SimpleNamespace

    from hybrid_rl.trainer.ppo.decoupled import DecoupledPPOTrainer

    buffer = SimpleNamespace(storage_type="sql", path=f"postgresql+psycopg://alice:{password}@127.0.0.1:1/rl")
    fake = SimpleNamespace(config=SimpleNamespace(async_training=SimpleNamespace(buffer=buffer)), run_dir="/r")
    assert DecoupledPPOTrainer._buffer_where(fake) == f"async_training.buffer.path={SHOWN}"


@pytest.mark.parametrize("override", [f"async_training.buffer.path={URL}",
                                      f"async_training.buffer.path='{URL.replace(':Hunter2', ':Pw Hunter2')}'"])
def test_cfg_job_prints_the_url_redacted(tmp_path, monkeypatch, capsys, override):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    try:
        main_ppo.main(["--cfg", "job", *SQL_BUFFER, override])
    except SystemExit:  # a check of the database before printing: its line must hide the password too
        pass
    out, err = capsys.readouterr()
    assert SHOWN in out + err and PASSWORD not in out + err
    assert not _files_with_password(tmp_path)


def test_a_user_error_line_and_the_driver_log_hide_the_password(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The database cannot be reached: one line on stderr, written in-process (no Ray needed)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)  # main_ppo may set it
    with pytest.raises(SystemExit) as exit_info:
        main_ppo.main(_run_args(tmp_path, tiny_model_dir))
    out, err = capsys.readouterr()
    assert exit_info.value.code == main_ppo.CONFIG_ERROR_EXIT_CODE
    assert SHOWN in err.splitlines()[-1] and PASSWORD not in out + err
    assert os.path.isfile(tmp_path / "run" / "logs" / "driver.log") and not _files_with_password(tmp_path)


def _run_args(tmp_path, model_dir) -> list[str]:
    """A one-step decoupled run on the tiny model whose SQL buffer is the password-holding URL."""
    return [f"actor_rollout_ref.model.path={model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
            "data.arithmetic.num_train=16", "data.arithmetic.num_test=4", "data.arithmetic.num_shots=0",
            "data.max_prompt_length=160", "data.max_response_length=4", "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.n_gpus_per_node=1",
            "rollout.n_gpus_per_node=1", "trainer.total_training_steps=1", "trainer.progress_bar=false",
            f"trainer.default_local_dir={tmp_path}/run", "trainer.logger=[console,jsonl]", *SQL_BUFFER,
            f"async_training.buffer.path={URL}"]


@pytest.mark.slow
def test_hydras_echo_of_a_failed_run_hides_the_password(tmp_path, tiny_model_dir):
    """HYBRID_RL_FULL_ERROR=1: the error reaches Hydra, which echoes the overrides and prints the
    traceback. The run reads a user's YAML without the package's ``hydra:`` section, so Hydra would
    write ``.hydra/overrides.yaml`` and a job log into ``outputs/`` if let."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text("defaults:\n  - ppo_trainer_schema\n  - _self_\n")
    result = _run_cli(tmp_path, tiny_model_dir, *_run_args(tmp_path, tiny_model_dir),  # the flags after every k=v
                      "--config-path", str(tmp_path / "conf"), "--config-name", "mine", env={"HYBRID_RL_FULL_ERROR": "1"})
    echo = [line for line in result.stderr.splitlines() if line.startswith("Error executing job with overrides")]
    assert result.returncode != 0 and len(echo) == 1 and f"async_training.buffer.path={SHOWN}" in echo[0]
    assert PASSWORD not in result.stdout + result.stderr and "Traceback" in result.stderr
    assert not list(tmp_path.rglob(".hydra")) and os.path.isfile(tmp_path / "run" / "logs" / "driver.log")
    assert not _files_with_password(tmp_path)


@pytest.mark.slow
def test_a_run_on_postgres_with_a_password_leaks_it_nowhere(tmp_path, tiny_model_dir, postgres_server):
    """A real one-step decoupled run whose buffer is a PostgreSQL database reached by password, with
    every tracker on (W&B, MLflow and SwanLab as recording stand-ins)."""
    database = "secrets_run"
    postgres_server.create_database(database)
    # a role of this test's own: the server is shared by the session (test_buffer_check makes "alice")
    url = postgres_server.create_user("secrets_run_user", PASSWORD, database=database)
    postgres_server.execute("GRANT ALL ON SCHEMA public TO secrets_run_user", database=database)
    fake = _fake_trackers(tmp_path / "fake")
    args = [a for a in _run_args(tmp_path, tiny_model_dir) if not a.startswith(("async_training.buffer.path=",
                                                                                  "trainer.logger="))]
    result = _run_cli(tmp_path, tiny_model_dir, *args, f"async_training.buffer.path='{url}'",
                      f"trainer.logger=[console,jsonl,{','.join(TRACKERS)}]", "trainer.test_freq=-1",
                      env={"PYTHONPATH": f"{fake}{os.pathsep}{REPO}",
                           "FAKE_TRACKER_LOG": str(tmp_path / "trackers.jsonl")})
    assert result.returncode == 0, result.stderr[-4000:]
    assert PASSWORD not in result.stdout + result.stderr
    payloads = (tmp_path / "trackers.jsonl").read_text()
    assert url.replace(PASSWORD, "***") in payloads and "log_params" in payloads
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and not _files_with_password(tmp_path)
