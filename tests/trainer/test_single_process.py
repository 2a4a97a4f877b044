"""trainer.single_process: when a command-line run hosts its worker in the driver's process, and the
environment it restarts with."""

import dataclasses
import logging
import os
import sys

import pytest

from hybrid_rl.trainer import get_config
from hybrid_rl.trainer.config.loader import to_ppo_config
from hybrid_rl.trainer.core.single_process import (REEXEC_MARK, apply_process_env, process_env,
                                              reexec_for_single_process, resolve_single_process,
                                              single_process_blockers)
from hybrid_rl.trainer.config.checks import make_run_plan, validate_config
from hybrid_rl.utils.cpu_env import JEMALLOC_CONF, bundled_jemalloc


def _cfg(*overrides):
    return to_ppo_config(get_config(list(overrides)))


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_auto_picks_one_process_only_for_a_one_worker_run_without_ray_features(monkeypatch):
    assert resolve_single_process(_cfg(), device="cpu").trainer.single_process is True
    assert resolve_single_process(_cfg(), device="cuda").trainer.single_process is True  # one GPU
    assert resolve_single_process(_cfg("trainer.n_gpus_per_node=2"), device="cuda").trainer.single_process is False
    for override in ("trainer.n_gpus_per_node=2", "trainer.max_restarts=1", "trainer.worker_call_timeout_s=60",
                     "ray_init.address=10.0.0.1:6379"):
        assert resolve_single_process(_cfg(override), device="cpu").trainer.single_process is False, override
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_single_process(_cfg(), device="cpu").trainer.single_process is False
    assert single_process_blockers(_cfg(), device="cpu") == []  # asked for by name, RAY_ADDRESS does not refuse it
    assert single_process_blockers(_cfg(), device="cuda") == []  # one GPU worker fits one process
    assert single_process_blockers(_cfg("trainer.n_gpus_per_node=8"), device="cuda") == [
        "8 workers (trainer.nnodes * trainer.n_gpus_per_node)"]


def test_one_gpu_passes_validation_and_eight_are_refused_in_one_line(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # validation reads only these of the GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    validate_config(_cfg("trainer.single_process=true", "trainer.device=cuda"))
    with pytest.raises(ValueError) as info:
        validate_config(_cfg("trainer.single_process=true", "trainer.device=cuda", "trainer.n_gpus_per_node=8"))
    lines = [line for line in str(info.value).splitlines() if "single_process" in line]
    assert len(lines) == 1 and "cannot host 8 workers" in lines[0] and "single_process=false" in lines[0]


def test_a_set_value_is_kept_and_planned():
    for value in (True, False):
        cfg = resolve_single_process(_cfg(f"trainer.single_process={str(value).lower()}"), device="cuda")
        assert cfg.trainer.single_process is value
    assert make_run_plan(_cfg("trainer.single_process=true")).single_process is True
    assert make_run_plan(_cfg()).single_process is False  # null from a notebook: Ray


def test_true_with_what_needs_ray_is_one_clear_error():
    cfg = _cfg("trainer.single_process=true", "trainer.max_restarts=2")
    with pytest.raises(ValueError, match=r"trainer.single_process=true cannot host automatic restarts "
                                         r"\(trainer.max_restarts=2\).*Set trainer.single_process=false"):
        validate_config(cfg)


def test_process_env_is_the_cpu_workers_env():
    cfg = _cfg("trainer.cpu_allocator=glibc")
    env = process_env(cfg, environ={})
    assert env["MALLOC_MMAP_MAX_"] == "0" and env["VLLM_CONFIGURE_LOGGING"] == "0"
    assert env["TOKENIZERS_PARALLELISM"] == "false" and "GOMP_SPINCOUNT" in env
    mine = process_env(cfg, environ={"MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "true"})
    assert mine["MALLOC_ARENA_MAX"] == "2" and "MALLOC_MMAP_MAX_" not in mine  # the user's allocator wins
    assert "TOKENIZERS_PARALLELISM" not in mine
    jemalloc = process_env(_cfg("trainer.cpu_allocator=jemalloc"), environ={})
    if bundled_jemalloc():
        assert jemalloc["LD_PRELOAD"] == bundled_jemalloc() and jemalloc["MALLOC_CONF"] == JEMALLOC_CONF
    else:
        assert jemalloc["MALLOC_MMAP_MAX_"] == "0"


def test_a_gpu_process_keeps_cudas_allocator():
    env = process_env(_cfg("trainer.device=cuda", "trainer.cpu_allocator=glibc"), environ={})
    assert "MALLOC_MMAP_MAX_" not in env and "GOMP_SPINCOUNT" not in env and "LD_PRELOAD" not in env
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["VLLM_CONFIGURE_LOGGING"] == "0"


def test_reexec_restarts_the_command_once_with_what_is_missing(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "hybrid_rl.trainer.main_ppo", "trainer.seed=1"])
    monkeypatch.delenv(REEXEC_MARK, raising=False)
    for key in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD", "MALLOC_CONF"):
        monkeypatch.delenv(key, raising=False)
    cfg = _cfg("trainer.cpu_allocator=glibc")
    reexec_for_single_process(cfg)
    (path, argv, env), = calls
    assert path == sys.executable and argv == [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", "trainer.seed=1"]
    assert env[REEXEC_MARK] == "1" and env["MALLOC_MMAP_MAX_"] == "0" and env["VLLM_CONFIGURE_LOGGING"] == "0"
    monkeypatch.setenv(REEXEC_MARK, "1")  # the restarted command does not restart again
    reexec_for_single_process(cfg)
    monkeypatch.delenv(REEXEC_MARK)
    for key, value in process_env(cfg).items():  # nothing missing: no restart
        monkeypatch.setenv(key, value)
    reexec_for_single_process(cfg)
    assert len(calls) == 1


def test_apply_in_a_running_process_sets_only_what_still_works(monkeypatch, caplog):
    cfg = _cfg("trainer.cpu_allocator=glibc")
    for key in [*process_env(cfg), "HYBRID_RL_LOG_LEVEL"]:  # restored after the test
        monkeypatch.delenv(key, raising=False)
    with caplog.at_level(logging.INFO, logger="hybrid_rl"):
        apply_process_env(cfg)
    assert os.environ["VLLM_CONFIGURE_LOGGING"] == "0" and "MALLOC_MMAP_MAX_" not in os.environ
    assert "take effect only at process start" in caplog.text
    assert "HYBRID_RL_LOG_LEVEL" not in os.environ  # a notebook's next run may ask for another level


def test_config_dataclass_default_is_auto():
    field = next(f for f in dataclasses.fields(type(_cfg().trainer)) if f.name == "single_process")
    assert field.default is None


def test_main_called_from_python_keeps_ray_and_never_restarts(monkeypatch):
    """``main(argv)`` (a test, a script) runs in a process that outlives the run: no automatic
    single process and no re-exec; only a real command line chooses them."""
    from hybrid_rl.trainer import main_ppo

    seen = []

    def fake_build(cfg, trainer_cls=None):
        seen.append(cfg.trainer.single_process)
        raise KeyboardInterrupt  # stop before anything starts

    monkeypatch.setattr(main_ppo, "build_trainer", fake_build)
    monkeypatch.setattr(os, "execve", lambda *a: (_ for _ in ()).throw(AssertionError("re-exec")))
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    with pytest.raises(KeyboardInterrupt):
        main_ppo.main(["trainer.total_training_steps=1"])
    assert seen == [None]
