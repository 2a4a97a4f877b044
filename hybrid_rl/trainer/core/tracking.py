"""Experiment trackers (``trainer.logger``) and the driver's progress bar.

``console`` and ``jsonl`` need nothing beyond the standard library; ``tensorboard``, ``wandb``,
``mlflow`` and ``swanlab`` use their real libraries, which are optional installs
(``pip install hybrid_rl[tracking]``): asking for one that is not installed is a ValueError at
start-up, before any compute is spent. The config each tracker records (W&B's, MLflow's params,
SwanLab's) is :func:`~hybrid_rl.utils.redact.redact_config`'s copy: no database password or secret-named
key leaves the machine.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
from typing import Any, Mapping

from hybrid_rl.trainer.config.run_checks import (  # re-exported: the trackers' vocabulary
    SUPPORTED_BACKENDS, as_backend_list, check_backends)
from hybrid_rl.utils.redact import redact_config

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class _Console:
    def log(self, data: Mapping[str, Any], step: int) -> None:
        body = " - ".join(f"{k}:{_fmt(v)}" for k, v in sorted(data.items()))
        logger.info("step:%d - %s", step, body)

    def finish(self) -> None:
        pass


class _Jsonl:
    """One JSON object per log call: ``{"step": N, "<metric>": value, ...}``; appended on resume."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        row = {"step": step}
        for key, value in data.items():
            # JSON has no NaN/inf: write them as null so every line stays parseable.
            row[key] = None if isinstance(value, float) and not math.isfinite(value) else value
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


class _TensorBoard:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in data.items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, project: str, name: str, config: dict | None):
        self._wandb = importlib.import_module("wandb")
        self._wandb.init(project=project, name=name, config=config)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._wandb.log(dict(data), step=step)

    def finish(self) -> None:
        self._wandb.finish()


class _Mlflow:
    def __init__(self, project: str, name: str, config: dict | None):
        self._mlflow = importlib.import_module("mlflow")
        self._mlflow.set_experiment(project)
        self._mlflow.start_run(run_name=name)
        if config:
            self._mlflow.log_params(_flatten(config))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        # MLflow rejects '@' in metric names (used by val-core/.../mean@N).
        clean = {k.replace("@", "_at_"): v for k, v in data.items() if isinstance(v, (int, float))}
        self._mlflow.log_metrics(clean, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


class _Swanlab:
    def __init__(self, project: str, name: str, config: dict | None, log_dir: str):
        self._swanlab = importlib.import_module("swanlab")
        self._swanlab.init(project=project, experiment_name=name, config=config, logdir=log_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._swanlab.log(dict(data), step=step)

    def finish(self) -> None:
        self._swanlab.finish()


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


class Tracking:
    """Fan one ``log(metrics, step)`` call out to every tracker named in ``trainer.logger``."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        backends: list[str],
        run_dir: str,
        config: dict | None = None,
    ):
        errors = check_backends(backends)
        if errors:
            raise ValueError("\n".join(errors))
        self.run_dir = run_dir
        config = redact_config(config) if config is not None else None
        self.jsonl_path = os.path.join(run_dir, METRICS_FILE)
        self._backends: dict[str, Any] = {}
        for name in backends:
            if name == "console":
                self._backends[name] = _Console()
            elif name == "jsonl":
                self._backends[name] = _Jsonl(self.jsonl_path)
            elif name == "tensorboard":
                log_dir = os.environ.get("TENSORBOARD_DIR", os.path.join(run_dir, "tensorboard"))
                self._backends[name] = _TensorBoard(log_dir)
            elif name == "wandb":
                self._backends[name] = _Wandb(project_name, experiment_name, config)
            elif name == "mlflow":
                self._backends[name] = _Mlflow(project_name, experiment_name, config)
            elif name == "swanlab":
                self._backends[name] = _Swanlab(project_name, experiment_name, config, run_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for backend in self._backends.values():
            backend.log(data, step)

    def finish(self) -> None:
        for backend in self._backends.values():
            backend.finish()
        self._backends = {}


class ProgressBar:
    """tqdm bar over training steps showing ETA and the latest mean reward (driver only)."""

    def __init__(self, total_steps: int, initial_step: int, enabled: bool = True):
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, desc="Training", unit="step")

    def update(self, metrics: Mapping[str, Any]) -> None:
        if self._bar is None:
            return
        postfix = {}
        if "critic/score/mean" in metrics:
            postfix["reward"] = f"{metrics['critic/score/mean']:.3f}"
        val = [v for k, v in metrics.items() if k.startswith("val-core/") and "/reward/mean@" in k]
        if val:
            postfix["val"] = f"{sum(val) / len(val):.3f}"
        self._bar.set_postfix(postfix)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
