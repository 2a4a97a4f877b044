"""The checks and derived values every mode shares: devices and workers, the ``trainer.*`` keys,
data files, model folders, and the vocabulary they check against (resume modes, trackers, what one
process cannot host); the values derived once (``RunPlan``).

A mode's config is any dataclass with ``trainer`` (:class:`~hybrid_rl.trainer.config.schema.TrainerConfig`),
``ray_init`` and ``data`` (``train_files`` / ``val_files``) sections: PPO's checks
(:mod:`hybrid_rl.trainer.config.checks`) and the supervised modes' (:mod:`hybrid_rl.trainer.config.supervised_checks`)
start from these. Every problem is one line naming the keys, their values and the fix.

These checks read configs (and the files they name); they import nothing of the trainer core. What
only the runtime knows -- whether the run folder can be written, the checkpoint a resume would load
-- the core checks before any worker starts (:mod:`hybrid_rl.trainer.core.runtime_checks`).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from hybrid_rl.utils.cpu_env import CPU_ALLOCATORS
from hybrid_rl.utils.devices import DEVICES, resolve_device

__all__ = ["RESUME_MODES", "RunPlan", "SUPPORTED_BACKENDS", "as_backend_list", "as_file_list", "check_backends",
           "check_data_files", "check_devices", "check_model_path", "check_trainer", "file_problem", "raise_problems",
           "run_dir", "single_process_blockers", "unwritable", "worker_layout", "world_size_problems"]

RESUME_MODES = ("auto", "disable", "resume_path")
"""``trainer.resume_mode``'s values (veRL's): the latest complete checkpoint, none, or ``resume_from_path``."""

SUPPORTED_BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow", "swanlab")
"""The trackers ``trainer.logger`` may name (:class:`~hybrid_rl.trainer.core.tracking.Tracking`'s)."""
_REQUIRED_MODULE = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab"}
"""The module that must be importable for each optional tracker."""


@dataclass(frozen=True)
class RunPlan:
    """Values derived once from the config (never written back into it)."""

    device: str
    """Resolved device: cpu or cuda."""
    world_size: int
    """Data-parallel workers = nnodes * n_gpus_per_node."""
    use_critic: bool
    """A critic is trained (GAE)."""
    use_reference_policy: bool
    """The reference policy is needed (KL in reward or KL loss)."""
    threads_per_worker: int
    """CPU threads each worker process uses (cores split evenly among workers)."""
    rollout_world_size: int = 0
    """Decoupled mode: rollout workers in their own pool (rollout.nnodes * n_gpus_per_node); 0 = colocated."""
    teacher_world_size: int = 0
    """Distillation: teacher workers in their own pool (distillation.nnodes * n_gpus_per_node); 0 = the
    teachers live in the training workers."""
    use_reward_model: bool = False
    """A colocated reward-model worker scores responses (reward_model.enable with a local model)."""
    single_process: bool = False
    """The one worker lives in the driver's process (``trainer.single_process``), not in a Ray actor."""
    use_greedy_baseline: bool = False
    """Each step also generates and scores one greedy response per prompt (the estimator's
    ``needs_greedy_baseline``)."""


def as_file_list(files: Any) -> list[str]:
    """``data.train_files`` as a list: veRL accepts a single path or a list of paths."""
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    return [os.fspath(f) for f in files]


def run_dir(cfg: Any) -> str:
    """Absolute run folder (``trainer.default_local_dir``): checkpoints, metrics, plot, logs/."""
    return os.path.abspath(os.path.expanduser(cfg.trainer.default_local_dir))


def file_problem(key: str, path: str, fix: str) -> Optional[str]:
    """The one line for a key that must name an existing file (``fix``: what to point it at), or None."""
    local = os.path.expanduser(path)
    if os.path.isfile(local):
        return None
    what = "is a folder, not a file" if os.path.isdir(local) else "does not exist"
    return f"{key}={path!r} {what}; {fix}."


def unwritable(folder: str) -> Optional[str]:
    """Why the run could not create or write ``folder`` (probed with a folder it creates and removes
    in the nearest existing one, since ``os.access`` says yes to root on a read-only mount), or None."""
    probe = folder
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is a file, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hybrid_rl_write_probe_", dir=probe))
    except OSError as error:
        return f"cannot create a folder in {probe} ({error.strerror or error})"
    return None


def as_backend_list(logger: Any) -> list[str]:
    """``trainer.logger`` as a list of tracker names (veRL accepts one name as a string)."""
    return [logger] if isinstance(logger, str) else list(logger or [])


def check_backends(backends: list[str]) -> list[str]:
    """Error messages for unknown or not-installed trackers in ``trainer.logger`` (empty = fine)."""
    errors = []
    for name in backends:
        if name not in SUPPORTED_BACKENDS:
            errors.append(
                f"trainer.logger contains unknown tracker {name!r}; valid trackers are "
                f"{list(SUPPORTED_BACKENDS)}."
            )
        elif name in _REQUIRED_MODULE and importlib.util.find_spec(_REQUIRED_MODULE[name]) is None:
            errors.append(
                f"trainer.logger contains {name!r} but the {_REQUIRED_MODULE[name]} package is not "
                f"installed; `pip install {_REQUIRED_MODULE[name]}` or remove it from trainer.logger."
            )
    return errors


def single_process_blockers(cfg: Any, device: Optional[str] = None) -> list[str]:
    """Why this run (any mode's config) needs its workers in Ray processes (empty: one process can
    host it); ``device``: the resolved ``trainer.device`` (not checked when None)."""
    t = cfg.trainer
    blockers = []
    if t.nnodes * t.n_gpus_per_node != 1:
        blockers.append(f"{t.nnodes * t.n_gpus_per_node} workers (trainer.nnodes * trainer.n_gpus_per_node)")
    own_pools = getattr(cfg, "own_pools", None)  # a mode whose config reserves pools says which (RunConfig)
    blockers += own_pools() if own_pools is not None else []
    if cfg.ray_init.address:
        blockers.append(f"a Ray cluster (ray_init.address={cfg.ray_init.address})")
    if t.max_restarts > 0:
        blockers.append(f"automatic restarts (trainer.max_restarts={t.max_restarts})")
    if t.worker_call_timeout_s is not None:
        blockers.append(f"a call deadline (trainer.worker_call_timeout_s={t.worker_call_timeout_s})")
    return blockers


def check_devices(cfg: Any) -> list[str]:
    """``trainer.device``, the worker count against the devices (or cores) there are."""
    import torch

    t = cfg.trainer
    if t.device not in DEVICES:
        return [f"trainer.device={t.device!r} is not one of {DEVICES}; set trainer.device=auto."]
    errors = []  # nnodes / n_gpus_per_node >= 1: their declared bounds
    device = resolve_device(t.device)
    if t.device == "cuda" and not torch.cuda.is_available():
        errors.append("trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu (or auto).")
    elif device == "cuda" and t.nnodes == 1 and t.n_gpus_per_node > torch.cuda.device_count():
        errors.append(
            f"trainer.n_gpus_per_node={t.n_gpus_per_node} but this machine has {torch.cuda.device_count()} GPUs; "
            "lower trainer.n_gpus_per_node."
        )
    elif device == "cpu" and t.nnodes == 1 and t.n_gpus_per_node > (cfg.ray_init.num_cpus or os.cpu_count() or 1):
        cores = cfg.ray_init.num_cpus or os.cpu_count()
        errors.append(
            f"trainer.n_gpus_per_node={t.n_gpus_per_node} CPU workers but only {cores} cores are available "
            "(ray_init.num_cpus / os.cpu_count()); lower trainer.n_gpus_per_node to at most the core count."
        )
    return errors


def check_model_path(key: str, path: str, trust_remote_code: Optional[bool] = None) -> list[str]:
    """A local HF folder or the embedded model id; with ``trust_remote_code`` given, also a causal LM."""
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, causal_lm_problem

    if not path:
        return [f"{key} is empty; set it to a local HF model folder or {EMBEDDED_MODEL_ID!r} (a critic usually "
                "starts from the actor's model path)."]
    if path == EMBEDDED_MODEL_ID:
        return []
    local = os.path.expanduser(path)
    if not os.path.isfile(os.path.join(local, "config.json")):
        return [f"{key}={path!r} is not a local HF model folder (no config.json) nor {EMBEDDED_MODEL_ID!r}; fix the path."]
    problem = None if trust_remote_code is None else causal_lm_problem(local, key, trust_remote_code)
    return [problem] if problem else []


def check_trainer(cfg: Any) -> list[str]:
    """The ``trainer.*`` keys every mode reads (trackers, logging, cadence, resume, checkpoints); the
    run folder and the resume point are the runtime's (:mod:`hybrid_rl.trainer.core.runtime_checks`)."""
    from hybrid_rl.utils.log_setup import LOG_LEVELS

    t = cfg.trainer
    if not isinstance(t.logger, str) and not all(isinstance(b, str) for b in t.logger or []):
        return [f"trainer.logger={t.logger!r} must be a tracker name or a list of them, e.g. "
                "trainer.logger=console or trainer.logger=[console,jsonl]."]
    errors = check_backends(as_backend_list(t.logger))
    if t.use_legacy_worker_impl not in ("auto", "enable"):
        errors.append(f"trainer.use_legacy_worker_impl={t.use_legacy_worker_impl!r} asks for veRL's new engine "
                      "workers, which hybrid_rl does not have; set it to auto (or enable).")
    if t.cpu_allocator not in CPU_ALLOCATORS:
        errors.append(f"trainer.cpu_allocator={t.cpu_allocator!r} must be one of {CPU_ALLOCATORS}; use auto "
                      "(jemalloc where Ray ships it), glibc or jemalloc.")
    if t.single_process not in (None, True, False):
        errors.append(f"trainer.single_process={t.single_process!r} must be true, false or null (auto).")
    elif t.single_process:
        blockers = single_process_blockers(cfg, resolve_device(t.device) if t.device in DEVICES else None)
        if blockers:
            errors.append(f"trainer.single_process=true cannot host {'; '.join(blockers)}: these need the workers "
                          "in Ray processes. Set trainer.single_process=false (or null to choose automatically).")
    if t.log_level.lower() not in LOG_LEVELS:
        errors.append(f"trainer.log_level={t.log_level!r} must be one of {LOG_LEVELS}; use info (quiet console) "
                      "or debug (everything).")
    for key in ("save_freq", "test_freq"):  # >= -1 is their declared bound
        if getattr(t, key) == 0:
            errors.append(f"trainer.{key}=0 must be a positive number of steps or -1 (never).")
    if t.resume_mode not in RESUME_MODES:
        errors.append(f"trainer.resume_mode={t.resume_mode!r} must be one of {RESUME_MODES}.")
    elif t.resume_mode == "resume_path" and not t.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>.")
    return errors


def check_data_files(data: Any) -> list[str]:
    """``data.train_files`` / ``val_files`` name existing files (folders and globs included), held-out
    files have training files beside them, ``data.bad_rows`` is a known policy."""
    from hybrid_rl.data.bad_rows import bad_rows_problems
    from hybrid_rl.data.files import expand_data_files

    errors = bad_rows_problems(data.bad_rows, None)  # the fraction's bounds are declared on the field
    for key, files in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        for path in as_file_list(files):
            try:
                named = expand_data_files(path)  # a folder or a glob names files
            except ValueError as error:
                errors.append(f"{key}: {error}")
                continue
            if not os.path.isfile(named[0]):
                errors.append(f"{key}: file {path!r} does not exist; fix the path or leave {key} unset.")
    why = unwritable(os.path.abspath(os.path.expanduser(data.arithmetic.cache_dir))) if data.train_files is None else None
    if why:  # the built-in task's files are generated there
        errors.append(f"data.arithmetic.cache_dir={data.arithmetic.cache_dir!r} cannot hold the built-in task's files: "
                      f"{why}. Fix: point it at a folder you can write, or set data.train_files.")
    if data.train_files is None and data.val_files is not None:
        errors.append(
            "data.val_files is set but data.train_files is not (the built-in arithmetic task is used); "
            "set both, or neither."
        )
    return errors


def worker_layout(cfg: Any, processes_per_node: Optional[int] = None) -> tuple[str, int, int]:
    """``(device, world size, CPU threads per worker)``: ``trainer.device`` resolved,
    ``nnodes * n_gpus_per_node`` workers, the cores split over ``processes_per_node`` (default the
    training workers of one node)."""
    t = cfg.trainer
    cores = cfg.ray_init.num_cpus or os.cpu_count() or 1
    return (resolve_device(t.device), t.nnodes * t.n_gpus_per_node,
            max(1, cores // (processes_per_node or t.n_gpus_per_node)))


def world_size_problems(cfg: Any, point: Any) -> list[str]:
    """Why the checkpoint ``point`` (a :class:`~hybrid_rl.trainer.core.checkpoints.ResumePoint`) cannot
    be loaded by this run's workers: it was saved by another number of them."""
    t = cfg.trainer
    saved, world = point.state.get("world_size"), t.nnodes * t.n_gpus_per_node
    if saved is None or saved == world:
        return []
    return [
        f"cannot resume from {point.step_dir}: it was saved by {saved} workers but this run has {world} "
        f"(trainer.nnodes={t.nnodes} * trainer.n_gpus_per_node={t.n_gpus_per_node}). Each worker saved its own "
        f"shard of the weights and optimizer state and its own RNG stream, so they only reload on {saved} "
        f"workers: set trainer.n_gpus_per_node so that nnodes * n_gpus_per_node = {saved}, or start fresh "
        "with trainer.resume_mode=disable (or another trainer.default_local_dir)."
    ]


def raise_problems(errors: list[str]) -> None:
    """One ValueError listing ``errors`` (one line for one problem); nothing when there are none."""
    if len(errors) == 1:
        raise ValueError(errors[0])
    if errors:
        raise ValueError(f"{len(errors)} config problems:\n" + "\n".join(f"- {e}" for e in errors))
