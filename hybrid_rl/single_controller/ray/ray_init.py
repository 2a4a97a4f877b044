"""``init_ray``: join an existing Ray cluster or start a local one, with the workers' environment.

An address comes from the ``address`` argument (``ray_init.address`` in the trainer config) or from
``RAY_ADDRESS``. It is probed with a plain TCP connection first, so an unreachable cluster is reported
within ``connect_timeout_s`` with the fix, instead of Ray's long retry loop. Without an address a local
Ray instance is started, sized to the machine unless ``num_cpus`` says otherwise.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray

__all__ = ["FORWARDED_ENV_VARS", "init_ray", "worker_env_vars"]

logger = logging.getLogger(__name__)

FORWARDED_ENV_VARS = (
    "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME",
    "HF_HUB_CACHE", "HF_DATASETS_CACHE", "NCCL_DEBUG", "VLLM_LOGGING_LEVEL", "CUDA_DEVICE_MAX_CONNECTIONS",
    # The CPU kind a run simulates and where the precision probe caches its result (utils/precision.py).
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "HYBRID_RL_CACHE", "HYBRID_RL_LOG_LEVEL",
    # Test-only fault injection (utils/faults.py): reaches the workers also on a cluster that was already up.
    "HYBRID_RL_FAULT", "HYBRID_RL_FAULT_STATE",
)
"""Driver environment variables copied into every worker (when set on the driver)."""

LOCAL_SYSTEM_CONFIG = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray settings of a local instance: no idle Python workers started ahead of need (Ray prestarts one
per CPU, ~80-120 MiB each, that the colocated workers never use: each rank is one actor)."""

DEFAULT_WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN"}
"""Worker environment defaults (overridden by the driver's values, then by the user's runtime_env)."""


def worker_env_vars(user_env: dict[str, str] | None = None) -> dict[str, str]:
    """The ``env_vars`` of the job's runtime_env: defaults < driver's forwarded vars < ``user_env``.

    ``PYTHONPATH`` also gets the directory holding the ``hybrid_rl`` package, so workers import the
    same code as the driver even when it is not pip-installed.
    """
    env = dict(DEFAULT_WORKER_ENV)
    env.update({k: os.environ[k] for k in FORWARDED_ENV_VARS if k in os.environ})
    user_env = dict(user_env or {})
    import hybrid_rl

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(hybrid_rl.__file__)))
    paths = [user_env.pop("PYTHONPATH", ""), package_root, os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for part in paths for p in part.split(os.pathsep) if p))
    env.update(user_env)
    return env


def init_ray(address: str | None = None, num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None,
             include_dashboard: bool = False, connect_timeout_s: float = 10.0, quiet: bool = False) -> None:
    """Connect to (``address`` / ``RAY_ADDRESS``) or start (otherwise) Ray; no-op if already initialised.
    ``quiet`` keeps Ray's own driver-side logging at WARNING and up."""
    if ray.is_initialized():
        logger.info("Ray is already initialised; init_ray() keeps the existing connection")
        return
    source = "address argument" if address else "RAY_ADDRESS environment variable"
    address = address or os.environ.get("RAY_ADDRESS") or None
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = worker_env_vars(runtime_env.get("env_vars"))
    level = logging.WARNING if quiet else logging.INFO
    if address in (None, "local"):
        ray.init(address="local" if address else None, num_cpus=num_cpus, runtime_env=runtime_env,
                 include_dashboard=include_dashboard, logging_level=level, _system_config=LOCAL_SYSTEM_CONFIG)
        logger.info("started a local Ray instance: %s", ray.cluster_resources())
        return
    if num_cpus is not None:
        logger.warning("num_cpus=%s is ignored when joining an existing Ray cluster (%s)", num_cpus, address)
    if address != "auto":
        _check_reachable(address, source, connect_timeout_s)
    try:
        ray.init(address=address, runtime_env=runtime_env, logging_level=level)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"could not join the Ray cluster at {address!r} (from the {source}): {e}. "
                           f"{_FIX}") from e
    logger.info("joined Ray cluster %s: %s", address, ray.cluster_resources())


_FIX = ("Start it with `ray start --head` on that machine, fix the address (ray_init.address or RAY_ADDRESS, "
        "host:port of the head node's GCS, default port 6379), or unset both to start a local Ray instance.")


def _check_reachable(address: str, source: str, timeout_s: float) -> None:
    host_port = address.split("://", 1)[-1]
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"Ray address {address!r} (from the {source}) is not host:port; {_FIX}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise ValueError(f"cannot reach the Ray cluster at {address!r} (from the {source}) within "
                         f"{timeout_s} s: {e}. {_FIX}") from e
