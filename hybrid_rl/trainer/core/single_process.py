"""``trainer.single_process``: a one-worker run (one CPU or one GPU) with its worker in the driver's
process, no Ray.

A laptop run has one CPU worker; a one-GPU run has one GPU worker. In its own Ray actor it costs a Ray cluster (GCS, raylet,
dashboard, agents, monitors: ~0.6 GiB) and a second copy of torch, transformers and the tokenizer
(~0.5 GiB) beside the driver; in the driver's process
(:class:`~hybrid_rl.single_controller.local.LocalWorkerGroup`) it costs neither, and computes the same
(a test compares the two bit for bit). ``null`` (auto) chooses it for command-line runs
(``main_ppo``, ``main_sft``, ``main_rm``, the benchmarks) of one worker (``nnodes * n_gpus_per_node == 1``, on CPU or on one
GPU) that need nothing only Ray gives: no cluster
address, no automatic restarts (``trainer.max_restarts``), no call deadline
(``trainer.worker_call_timeout_s``), no separate rollout pool. A notebook's ``run_ppo`` keeps Ray
unless told ``trainer.single_process=true``: its process outlives the run, and Ray's workers return
their memory when the run ends.

The worker's process settings (for a CPU worker the memory allocator and OpenMP waiting; the
libraries' logging) must be in the environment when the process starts: :func:`reexec_for_single_process` restarts the
command once with them, as Ray starts its actors with them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Optional

from hybrid_rl.trainer.config.run_checks import single_process_blockers  # re-exported: the checks use it
from hybrid_rl.trainer.core.run_config import RunConfig
from hybrid_rl.utils.cpu_env import cpu_worker_env
from hybrid_rl.utils.log_setup import LOG_LEVEL_ENV, library_env

__all__ = ["resolve_single_process", "single_process_blockers", "process_env", "reexec_for_single_process",
           "apply_process_env"]

logger = logging.getLogger(__name__)

REEXEC_MARK = "HYBRID_RL_SINGLE_PROCESS_REEXEC"
"""Set in the environment of the restarted command, so that it restarts at most once."""

DEFAULT_PROCESS_ENV = {"TOKENIZERS_PARALLELISM": "false"}
"""Set when absent (as Ray's workers get it): the tokenizer's threads would compete with torch's."""


def resolve_single_process(cfg: RunConfig, device: Optional[str] = None) -> RunConfig:
    """``cfg`` with ``trainer.single_process`` chosen for a command-line run where it is null (see the
    module docstring); ``device`` is the resolved ``trainer.device`` (resolved here when None)."""
    if cfg.trainer.single_process is not None:
        return cfg
    # An exported RAY_ADDRESS says where Ray runs: no reason to refuse one process if asked for
    # by name, but a reason not to choose it.
    chosen = not single_process_blockers(cfg) and not os.environ.get("RAY_ADDRESS")
    if chosen and device is None:
        from hybrid_rl.utils.devices import resolve_device

        device = resolve_device(cfg.trainer.device)
    chosen = chosen and device in ("cpu", "cuda")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, single_process=chosen))


def process_env(cfg: RunConfig, environ: Optional[dict] = None) -> dict[str, str]:
    """The environment variables the single process needs, as its worker gets them under Ray: for a
    CPU worker the allocator and OpenMP settings (:func:`~hybrid_rl.utils.cpu_env.cpu_worker_env`,
    the user's own ``MALLOC_*``/``LD_PRELOAD`` win); the libraries' logging, :data:`DEFAULT_PROCESS_ENV`."""
    from hybrid_rl.utils.devices import resolve_device

    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in DEFAULT_PROCESS_ENV.items() if k not in environ}
    if resolve_device(cfg.trainer.device) == "cpu":  # a GPU worker's allocator is CUDA's, as under Ray
        env.update(cpu_worker_env(environ, cfg.trainer.cpu_allocator))
    env.update(library_env(cfg.trainer.log_level))
    return env


def _missing(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


def reexec_for_single_process(cfg: RunConfig) -> None:
    """Restart this command (``sys.orig_argv``) with :func:`process_env` added, if any of it is
    missing and it was not restarted already; returns only when nothing needs a restart."""
    missing = _missing(process_env(cfg))
    if not missing or os.environ.get(REEXEC_MARK):
        return
    logger.debug("restarting the command with %s", missing)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **missing, REEXEC_MARK: "1"})


def apply_process_env(cfg: RunConfig) -> None:
    """Set what of :func:`process_env` still takes effect in a running process (the libraries'
    logging, read when they are imported); say once that the allocator settings could not."""
    missing = _missing(process_env(cfg))
    missing.pop(LOG_LEVEL_ENV, None)  # this process already runs at its level; a notebook's next run may not
    late = sorted(k for k in missing if k.startswith(("MALLOC_", "LD_PRELOAD", "GOMP_", "OMP_")))
    if late:
        logger.info("trainer.single_process: %s take effect only at process start (run from the command "
                    "line for them); this process keeps its current allocator", ", ".join(late))
    for key, value in missing.items():
        if key not in late:
            os.environ[key] = value
