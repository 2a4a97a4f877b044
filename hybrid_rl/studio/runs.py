"""Launch a run from the studio and watch any run's folder as it grows.

A launched run is the command line's own: the exported YAML is written into the run's folder
(``trainer.default_local_dir``) as ``studio_config.yaml`` (mode 0600: it may hold a password) and, alone,
into a new private folder there, from which ``python -m hybrid_rl.trainer.main_ppo --config-path
<that folder> --config-name studio_config`` runs as a subprocess, its output in ``studio_console.log``
in the run folder. Watching reads what every run writes there (``metrics.jsonl``
from the ``jsonl`` logger, ``val_generations.jsonl``), so a run started from the CLI is watched the
same way. Stopping sends SIGINT, as Ctrl-C would; the run resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from hybrid_rl.studio.form import to_yaml

CONFIG_NAME = "studio_config"
"""The YAML a launched run reads, in its run folder."""
CONSOLE_LOG = "studio_console.log"
"""A launched run's console output, in its run folder."""
CHARTS = (
    ("Reward", "score", ("critic/score/mean",)),
    ("Validation accuracy", "accuracy", ("val-core/",)),
    ("Response length", "tokens", ("response_length/mean",)),
    ("KL", "KL", ("actor/kl_loss", "critic/kl", "actor/ppo_kl")),
    ("Step time", "seconds", ("timing_s/step",)),
)
"""The page's charts: ``(title, y-axis label, metric keys)`` against the step; a key ending in ``/``
takes every metric under it (one validation curve per data source)."""
CURVES = tuple(k for _, _, keys in CHARTS for k in keys if not k.endswith("/")) + (
    "training/global_step", "training/total_steps", "timing_s/validate")
"""Metric keys a progress report keeps, with every ``val-core/*`` key but the spreads (the validation curves)."""
CONSOLE_LINES = 20
"""Console lines a progress report carries (the end of a launched run's console, or of a watched run's
``logs/driver.log``)."""


Inside = Optional[Callable[[Path], bool]]
"""Whether a resolved path may be read (:meth:`hybrid_rl.studio.workspace.Workspace.inside`); None = any."""


def _readable(path: Path, inside: Inside) -> bool:
    """Whether ``path`` is a file that ``inside`` allows once resolved (a link out of the workspace is not)."""
    return path.is_file() and (inside is None or inside(path.resolve()))


def _rows(path: Path, inside: Inside = None) -> list[dict[str, Any]]:
    """The parseable JSON lines of ``path`` (a line being written is skipped until complete)."""
    if not _readable(path, inside):
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _tail(path: Path, lines: int = CONSOLE_LINES, inside: Inside = None) -> list[str]:
    """The last ``lines`` lines of a text file (its last 64 KiB read), [] when there is none. A line
    redrawn with carriage returns (a progress bar) shows its last state."""
    if not _readable(path, inside):
        return []
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - 65536))
        text = fh.read().decode("utf-8", errors="replace")
    return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")[-lines - 1:] if line.strip()][-lines:]


def _number(value: Any) -> Optional[float]:
    """``value`` when it is a finite number (the jsonl logger writes NaN as null), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _row_seconds(row: dict[str, Any]) -> float:
    """A metric row's time: its step's (validation included), or for the step-0 row its validation's."""
    if "timing_s/step" in row:
        return _number(row["timing_s/step"]) or 0.0
    return _number(row.get("timing_s/validate")) or 0.0


def run_status(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """``{step, total, elapsed_s, s_per_step, eta_s}`` of a run's metric rows: the last step, the
    planned steps, the time its logged steps took (validation included), the mean of the last
    (up to 3) steps' times and the time left at that pace (None where unknown). Rows without a
    numeric step are skipped."""
    rows = [(int(_number(m.get("step"))), m) for m in metrics if _number(m.get("step")) is not None]
    step = max([s for s, _ in rows] or [0])
    totals = [_number(m.get("training/total_steps")) for _, m in rows]
    total = next((int(t) for t in reversed(totals) if t is not None), None)
    elapsed = sum(_row_seconds(m) for _, m in rows)
    times = [_number(m.get("timing_s/step")) for s, m in rows if s >= 1]
    recent = [t for t in times if t is not None][-3:]
    pace = sum(recent) / len(recent) if recent else None
    eta = max(0, total - step) * pace if (total is not None and pace is not None) else None
    return {"step": step, "total": total, "elapsed_s": round(elapsed, 1),
            "s_per_step": None if pace is None else round(pace, 2), "eta_s": None if eta is None else round(eta, 1)}


def _is_val_curve(key: str) -> bool:
    """A ``val-core/`` accuracy curve; its spreads (``best@4/std``) are no accuracy of their own."""
    return key.startswith("val-core/") and not key.endswith("/std")


def read_progress(run_dir: str, num_samples: int = 3, inside: Inside = None) -> dict[str, Any]:
    """``{"run_dir", "metrics": [{step, curve keys...}], "samples": [last validation samples],
    "status": run_status(...), "console": [last lines]}`` of a run folder; only files ``inside``
    allows are read."""
    folder = Path(run_dir).expanduser()
    metrics = [{k: v for k, v in row.items() if k == "step" or k in CURVES or _is_val_curve(k)}
               for row in _rows(folder / "metrics.jsonl", inside)]
    samples = _rows(folder / "val_generations.jsonl", inside)[-num_samples:]
    console = (_tail(folder / CONSOLE_LOG, inside=inside)
               or _tail(folder / "logs" / "driver.log", inside=inside))
    return {"run_dir": str(folder.resolve()), "metrics": metrics, "samples": samples,
            "status": run_status(metrics), "console": console}


def read_runs(folder: str, inside: Inside = None) -> dict[str, Any]:
    """A run folder's progress (:func:`read_progress`) with ``runs``: ``[{name, metrics}]`` of the run
    itself, or of every sub-folder holding a ``metrics.jsonl`` when it holds none (several runs of one
    folder, overlaid; the samples, status and console are then the first run's). Only files
    ``inside`` allows are read."""
    root = Path(folder).expanduser()
    children = [root] if (root / "metrics.jsonl").is_file() else sorted(
        p.parent for p in root.glob("*/metrics.jsonl") if _readable(p, inside))
    progress = [read_progress(str(child), inside=inside) for child in children]
    first = progress[0] if progress else read_progress(str(root), inside=inside)
    runs = [{"name": child.name, "metrics": p["metrics"]} for child, p in zip(children, progress)]
    return {**first, "run_dir": str(root.resolve()), "runs": runs}


LAUNCH_DIR_PREFIX = ".studio_launch_"
"""A launch's own folder in its run folder (``<prefix><random>``): the YAML the run reads, alone."""


def _open_private(path: Path, flag: int) -> int:
    """``path`` opened for writing (``flag``: ``os.O_APPEND`` or ``os.O_TRUNC``), created readable by its
    owner only (0600, tightened if it existed); a symlink there is refused (OSError), never followed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.fchmod(fd, 0o600)
    return fd


def write_launch_config(run_dir: Path, text: str) -> Path:
    """Write a launch's YAML ``text`` (it may hold a password) readable by its owner only: as
    ``studio_config.yaml`` in ``run_dir`` (the record of the run) and alone in a new private folder
    there, which it returns: the run reads its config from that folder, so no file already in the run
    folder (a ``ppo_trainer_schema.yaml``) takes part in the composition. OSError when it cannot."""
    import tempfile

    config_dir = Path(tempfile.mkdtemp(prefix=LAUNCH_DIR_PREFIX, dir=run_dir))  # new, empty, 0700
    for folder in (run_dir, config_dir):
        with os.fdopen(_open_private(folder / f"{CONFIG_NAME}.yaml", os.O_TRUNC), "w", encoding="utf-8") as fh:
            fh.write(text)
    return config_dir


@dataclass
class LaunchedRun:
    """A run the studio started."""

    run_dir: Path
    """Its ``trainer.default_local_dir``."""
    process: subprocess.Popen = field(repr=False)
    """The ``main_ppo`` subprocess."""

    def state(self, inside: Inside = None) -> dict[str, Any]:
        """Whether it runs, its exit code and its progress (:func:`read_runs`)."""
        code = self.process.poll()
        return {"running": code is None, "returncode": code, **read_runs(str(self.run_dir), inside)}

    def stop(self) -> None:
        """SIGINT to the run's process group (its own session), as Ctrl-C sends it to a terminal's."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch would do, known before anything starts."""

    run_dir: Path
    """The run's folder (``trainer.default_local_dir``, resolved)."""
    config: dict[str, Any] = field(repr=False)
    """The composed config, interpolations resolved, as nested dicts (what the run will read)."""


class RunLauncher:
    """Starts ``main_ppo`` runs from form values and keeps them by id (this server's lifetime)."""

    def __init__(self, cwd: Optional[str] = None, plugins: tuple[str, ...] = ()):
        self.cwd = Path(cwd or os.getcwd())
        self.plugins = tuple(os.path.abspath(p) for p in plugins)  # imported by each launched run
        self.runs: dict[int, LaunchedRun] = {}
        self._lock = threading.Lock()  # FastAPI runs plain endpoints in a thread pool

    def plan(self, values: Mapping[str, Any]) -> LaunchPlan:
        """The run folder and composed config of ``values`` (already checked); ValueError naming
        ``trainer.default_local_dir`` when it is a file."""
        import dataclasses

        from hybrid_rl.studio.form import to_overrides
        from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
        from hybrid_rl.utils.log_setup import recorded_config_notices

        with recorded_config_notices():  # the launched run prints its own notices
            config = to_ppo_config(get_config(to_overrides(values)))  # interpolated
        folder = config.trainer.default_local_dir
        run_dir = (self.cwd / os.path.expanduser(folder)).resolve()
        if run_dir.exists() and not run_dir.is_dir():
            raise ValueError(f"trainer.default_local_dir={folder!r} is a file ({run_dir}); a run writes its "
                             "checkpoints, metrics and console into a folder. Fix: give a folder's path")
        return LaunchPlan(run_dir=run_dir, config=dataclasses.asdict(config))

    def launch(self, plan: LaunchPlan, values: Mapping[str, Any]) -> int:
        """Start a run of ``values`` into ``plan.run_dir``; returns its id. ValueError when a run of
        this studio still writes there, or the folder cannot be created."""
        run_dir = plan.run_dir
        with self._lock:
            busy = [i for i, run in self.runs.items() if run.run_dir == run_dir and run.process.poll() is None]
            if busy:
                raise ValueError(f"run {busy[0]} is still writing to {run_dir}; stop it or set "
                                 "trainer.default_local_dir (or trainer.experiment_name) to another folder")
            try:
                return self._start(run_dir, values)
            except OSError as error:  # unwritable, or a file on the way
                raise ValueError(f"trainer.default_local_dir: cannot write the run folder {run_dir} "
                                 f"({error.strerror or error}). Fix: give a folder you can write") from None

    def _start(self, run_dir: Path, values: Mapping[str, Any]) -> int:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_dir = write_launch_config(run_dir, to_yaml(values))
        arguments = ["--config-path", str(config_dir), "--config-name", CONFIG_NAME]
        command = ([sys.executable, "-m", "hybrid_rl.studio.run_with_plugins", *self.plugins, "--", *arguments]
                   if self.plugins else [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *arguments])
        with os.fdopen(_open_private(run_dir / CONSOLE_LOG, os.O_APPEND), "ab") as log:
            process = subprocess.Popen(command, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        run_id = len(self.runs) + 1
        self.runs[run_id] = LaunchedRun(run_dir=run_dir, process=process)
        return run_id

    def get(self, run_id: int) -> LaunchedRun:
        if run_id not in self.runs:
            raise KeyError(f"no run {run_id} was started from this studio; started: {sorted(self.runs)}")
        return self.runs[run_id]

    def stop_all(self) -> None:
        for run in self.runs.values():
            run.stop()
