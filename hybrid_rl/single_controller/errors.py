"""Errors raised by worker groups, and the worker description + log tail they carry.

A dead or hung worker must be *named* (role, rank, pid, node), with the method that was running and the
last lines of its log, so that the user sees the real cause (an OOM kill, a segfault, a Python
traceback) instead of a bare ``ActorDiedError`` or a silent hang.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass, field

__all__ = ["WorkerGroupError", "WorkerGroupTimeoutError", "WorkerInfo", "fill_from_ray_error", "short_reason",
           "tail_worker_log"]

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 20
"""How many trailing log lines of a failed worker go into the error message."""


class WorkerGroupError(RuntimeError):
    """A worker of a group died (or could not be started): the message names it and quotes its log."""


class WorkerDiedError(WorkerGroupError):
    """A worker's process died during a call (killed, e.g. by the kernel's OOM killer, or crashed)."""


class WorkerGroupTimeoutError(WorkerGroupError, TimeoutError):
    """A worker-group call did not finish within ``call_timeout_s``: the message names the silent workers."""


@dataclass
class WorkerInfo:
    """Identity of one worker process, shown in error messages."""

    role: str
    """Worker-group name (the role for colocated views, e.g. ``actor_rollout``)."""
    rank: int
    """Global rank in the group."""
    world_size: int
    """Number of workers in the group."""
    actor_name: str = ""
    """Ray actor name."""
    actor_id: str | None = None
    """Ray actor id (hex), once known."""
    pid: int | None = None
    """Worker process id, once the worker has answered once."""
    node_ip: str | None = None
    """IP address of the node the worker runs on."""
    log_files: tuple[str, ...] = field(default_factory=tuple)
    """Paths of the worker's stdout/stderr files (on its node), as reported by the worker itself."""

    def describe(self) -> str:
        where = f"pid {self.pid if self.pid is not None else '?'}, node {self.node_ip or '?'}"
        return f"{self.role} rank {self.rank}/{self.world_size} ({where}, actor {self.actor_name or self.actor_id})"


def tail_worker_log(info: WorkerInfo, num_lines: int = LOG_TAIL_LINES) -> str:
    """The last ``num_lines`` lines of the worker's stderr and stdout files, or a note saying why not."""
    paths = list(dict.fromkeys(p for p in info.log_files if p)) or _find_log_files_by_pid(info.pid)
    if not paths:
        return (f"(no log file found for pid {info.pid}; look in the Ray session log dir on node "
                f"{info.node_ip or '?'}, e.g. /tmp/ray/session_latest/logs/worker-*-{info.pid}.err)")
    parts = []
    # stderr first: Python tracebacks and logging go there.
    for path in sorted(paths, key=lambda p: not p.endswith(".err")):
        if not os.path.exists(path):
            parts.append(f"(log file {path} is not readable from the driver: it lives on node {info.node_ip})")
            continue
        lines = _read_tail(path, num_lines)
        if lines:
            parts.append(f"--- last {len(lines)} lines of {path}\n" + "\n".join(lines))
    return "\n".join(parts) if parts else f"(log files {', '.join(paths)} are empty)"


def fill_from_ray_error(info: WorkerInfo, error: BaseException) -> None:
    """Ray's actor-error text carries ``pid`` and ``ip``; use them when the worker never reported its own."""
    text = str(error)
    pid = re.search(r"\bpid[:=]\s*(\d+)", text)
    ip = re.search(r"\bip[:=]\s*([0-9a-fA-F.:]+[0-9a-fA-F])", text)
    if info.pid is None and pid:
        info.pid = int(pid.group(1))
    if info.node_ip is None and ip:
        info.node_ip = ip.group(1)


def short_reason(error: BaseException, max_chars: int = 300) -> str:
    """The informative part of a Ray actor error (why the actor died), on one line."""
    text = _ANSI.sub("", str(error))
    for line in text.splitlines():
        if "actor is dead because" in line.lower():
            return line.strip()[:max_chars]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}"[:max_chars]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:")


def _read_tail(path: str, num_lines: int, max_bytes: int = 256 * 1024) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return [f"(could not read {path}: {e})"]
    # Ray prefixes each worker log with marker lines (job id, actor name): not useful to a reader.
    lines = [_ANSI.sub("", ln) for ln in text.splitlines() if ln.strip() and not ln.startswith(_RAY_MARKERS)]
    return lines[-num_lines:]


def _find_log_files_by_pid(pid: int | None) -> list[str]:
    if pid is None:
        return []
    patterns = [os.path.join(d, f"worker-*-{pid}.{ext}") for d in _session_log_dirs() for ext in ("err", "out")]
    # session_latest is a symlink to the current session: keep one path per real file.
    found = {os.path.realpath(p): p for pattern in patterns for p in glob.glob(pattern)}
    return sorted(found.values())


def _session_log_dirs() -> list[str]:
    dirs = []
    try:
        import ray._private.worker as ray_worker  # private, but the only way to get this session's dir

        node = ray_worker._global_node
        if node is not None:
            dirs.append(node.get_logs_dir_path())
    except Exception as e:  # noqa: BLE001 - best effort: fall back to the default location below
        logger.debug("could not get Ray's session log dir: %s", e)
    dirs.append("/tmp/ray/session_latest/logs")
    return dirs
