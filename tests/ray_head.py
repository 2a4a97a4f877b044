"""One Ray head for the test session's command-line runs, so each run joins it instead of starting
and stopping its own local Ray.

A CLI run on the tiny model takes ~16.5 s on 2 cores, of which ~3 s start a local Ray and ~3.5 s stop
it and end the process; joining a running head takes ~0.1 s and leaving it ~0.3 s (~12.3 s a run,
AMD Zen 4). The suite makes some 70 such runs.

The head is what a user gets from ``ray start --head`` (2 CPUs, no dashboard, no prestarted workers),
started on first use and stopped when the session ends (:func:`stop`, from conftest's
``pytest_sessionfinish``). It keeps its own temp folder, so a plain ``ray.init()`` in the test process
still starts a local instance, and its own auth token, passed to the runs that join it.

:func:`join` decides per run: only a run that would start a local Ray of 2 CPUs for 2 workers
(``trainer.n_gpus_per_node=2``, ``ray_init.num_cpus=2``, no address, not single-process) joins; every
other run (1 CPU, one worker, a cluster of its own, ``HYBRID_RL_TEST_LOCAL_RAY=1``) is left as it is.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from hybrid_rl.single_controller.worker import find_free_port

LOCAL_ENV = "HYBRID_RL_TEST_LOCAL_RAY"
"""Set to 1 to give every CLI run its own local Ray again (as before the shared head)."""

_head: Optional[dict] = None


_PDEATHSIG_EXEC = ("import ctypes, os, signal, sys; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
"""Run in the head's own process before it becomes ``ray start``: SIGTERM it when the test process
ends, even by SIGKILL (PR_SET_PDEATHSIG survives the exec; Linux). A wrapper, not ``preexec_fn``, which
is unsafe in a process that already runs threads."""


def _start() -> dict:
    folder = tempfile.mkdtemp(prefix="hrl_ray_")  # short: Ray's socket paths must stay < 108 characters
    token, port = secrets.token_hex(16), find_free_port()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("HYBRID_RL_FAULT")}
    system = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
    wrapper = [sys.executable, "-c", _PDEATHSIG_EXEC] if sys.platform.startswith("linux") else [sys.executable]
    cmd = [*wrapper, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--num-cpus=2",
           "--include-dashboard=false", "--disable-usage-stats", f"--port={port}", f"--temp-dir={folder}", f"--system-config={json.dumps(system)}",
           # free ports where Ray has fixed defaults (10001, 52365), so a Ray of the user's is no obstacle
           f"--ray-client-server-port={find_free_port()}", f"--dashboard-agent-listen-port={find_free_port()}"]
    log = open(os.path.join(folder, "ray_start.log"), "w")
    process = subprocess.Popen(cmd, env={**env, **auth}, cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    head = {"process": process, "folder": folder, "log": log, "auth": auth, "address": f"127.0.0.1:{port}"}
    deadline = time.time() + 300  # generous: a loaded 2-core machine starts Ray slowly
    while not os.path.exists(os.path.join(folder, "ray_current_cluster")):
        if process.poll() is not None or time.time() > deadline:
            text = open(log.name).read()[-2000:]
            _stop(head, wait_s=0)
            raise RuntimeError(f"`ray start --head` did not come up: {text}")
        time.sleep(0.1)
    return head


def _last(overrides: list[str], key: str) -> Optional[str]:
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def joins(overrides: list[str]) -> bool:
    """True if a run of ``overrides`` would start a local Ray of 2 CPUs for 2 workers (see the module)."""
    return (os.environ.get(LOCAL_ENV) != "1" and _last(overrides, "ray_init.num_cpus") == "2"
            and _last(overrides, "trainer.n_gpus_per_node") == "2" and _last(overrides, "trainer.nnodes") in (None, "1")
            and _last(overrides, "ray_init.address") is None and _last(overrides, "trainer.single_process") != "true")


def join(overrides: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``(overrides, env)`` of a CLI run, pointed at the shared head when :func:`joins` says so."""
    global _head
    if not joins(overrides):
        return overrides, env
    if _head is None:
        _head = _start()
    # ray_init.num_cpus=2 stays: besides the local Ray's size it sets each worker's CPUs and threads
    return [*overrides, f"ray_init.address={_head['address']}"], {**env, **_head["auth"]}


def _stop(head: dict, wait_s: float) -> None:
    """Stop one head (``ray start --block`` stops every process it started; SIGKILL to its process
    group after ``wait_s``) and remove its folder."""
    process = head["process"]
    process.terminate()
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever is left of its session
    except (ProcessLookupError, PermissionError):
        pass
    head["log"].close()
    shutil.rmtree(head["folder"], ignore_errors=True)


def stop() -> None:
    """Stop the session's head, if one was started."""
    global _head
    if _head is not None:
        head, _head = _head, None
        _stop(head, wait_s=60)
