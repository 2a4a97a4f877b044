"""Run untrusted Python (a model's code) in a limited subprocess: no containers, no root needed.

>>> run_python("print(input()[::-1])", stdin="abc").stdout
'cba\\n'

Each run gets a fresh temporary folder (mode 0700, removed afterwards) holding ``main.py``, and
``python -I -S -B`` runs the bootstrap :mod:`hybrid_rl.reward._sandbox_child` there, which narrows
the child before the program starts (details and the exact layers in docs/sandbox.md):

* **CPU time** (``RLIMIT_CPU``) and a **wall clock** (``timeout_s``; the whole process group is
  killed), **address space** (``RLIMIT_AS``), **file size** (``RLIMIT_FSIZE``), **output** (stdout +
  stderr read up to ``max_output_bytes``, then the child is killed);
* **no new processes**: a seccomp filter (x86_64/aarch64) refuses ``fork``/``clone`` of processes, root
  included; the child runs in its own session and its process group is killed when the run ends;
* **writes only inside the folder**: Landlock (Linux >= 5.13) in the kernel, an audit hook in Python;
  ``HOME``/``TMPDIR`` point at the folder;
* **no secrets**: the environment is rebuilt from a small allow-list, nothing else is inherited.

The result names one reason: ``ok`` or one of :data:`FAILURE_REASONS`. What is *not* isolated (reads
anywhere the user may read, UDP, CPU share, the kernel itself) is listed in docs/sandbox.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Optional

__all__ = ["FAILURE_REASONS", "SandboxConfig", "SandboxResult", "run_python"]

logger = logging.getLogger(__name__)

FAILURE_REASONS = ("timeout", "memory", "file_size", "processes", "forbidden_write", "error")
"""Why a sandboxed run failed: past its CPU or wall time; out of address space; a file past
``max_file_bytes`` or output past ``max_output_bytes``; it tried to start a process (or signal one
outside it); it tried to write outside its folder; any other non-zero exit or signal."""

_BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py")
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_SIGNAL_REASONS = {signal.SIGXCPU: "timeout", signal.SIGXFSZ: "file_size"}
_MIB = 1 << 20


@dataclass(kw_only=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    timeout_s: float = 5.0
    """Wall-clock limit in seconds; past it the process group is killed (reason ``timeout``)."""
    cpu_s: Optional[float] = None
    """CPU-time limit (``RLIMIT_CPU``, whole seconds, rounded up); None = ``timeout_s``."""
    memory_mb: int = 512
    """Address-space limit (``RLIMIT_AS``) in MiB; Python itself needs ~30."""
    max_file_bytes: int = 10 * _MIB
    """Largest file the program may write (``RLIMIT_FSIZE``)."""
    max_output_bytes: int = 1 * _MIB
    """stdout + stderr kept; past it the child is killed and the run fails with ``file_size``."""
    env_allow: tuple[str, ...] = ()
    """Names of this process's environment variables passed on (besides PATH, LANG, LC_ALL, HOME and
    TMPDIR, which are set by the sandbox). Nothing else is inherited: API keys never reach the child."""
    python: str = sys.executable
    """The interpreter that runs the code (``-I -S -B``: no user site, no site-packages, no .pyc)."""

    def __post_init__(self) -> None:
        checks = [("timeout_s", self.timeout_s > 0), ("memory_mb", self.memory_mb >= 32),
                  ("max_file_bytes", self.max_file_bytes >= 0), ("max_output_bytes", self.max_output_bytes > 0),
                  ("cpu_s", self.cpu_s is None or self.cpu_s > 0)]
        for key, ok in checks:
            if not ok:
                raise ValueError(f"sandbox {key}={getattr(self, key)!r} is out of range; set timeout_s > 0, "
                                 "cpu_s > 0 (or None), memory_mb >= 32, max_file_bytes >= 0, max_output_bytes > 0")
        if isinstance(self.env_allow, str):
            raise ValueError(f"sandbox env_allow={self.env_allow!r} is a string; give a list of variable names, "
                             f"e.g. [{self.env_allow!r}]")
        self.env_allow = tuple(self.env_allow)

    @classmethod
    def of(cls, value: "SandboxConfig | dict | None") -> "SandboxConfig":
        """A config from itself, a mapping (a YAML section) or None (the defaults)."""
        if value is None or isinstance(value, cls):
            return value or cls()
        if not isinstance(value, dict):
            raise ValueError(f"sandbox config must be a mapping of SandboxConfig fields, got {type(value).__name__}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sandbox config key(s) {sorted(unknown)}; valid: "
                             f"{sorted(cls.__dataclass_fields__)}")
        return cls(**value)


@dataclass
class SandboxResult:
    """What one run did."""

    reason: str
    """``ok`` (exit status 0 within every limit) or one of :data:`FAILURE_REASONS`."""
    returncode: Optional[int]
    """The exit status (negative: killed by that signal)."""
    stdout: str
    """What it printed (UTF-8, undecodable bytes replaced), at most ``max_output_bytes`` with stderr."""
    stderr: str
    """Its error output (a traceback), same cap."""
    wall_s: float
    """Seconds from start to exit."""
    layers: tuple[str, ...]
    """The limits that took hold in the child: ``rlimits``, ``seccomp`` (or ``nproc``), ``landlock``,
    ``audit``; a missing one is not enforced on this machine."""
    pid: int
    """The child's process id (= its process group id)."""

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


class _Capture:
    """Reads stdout and stderr on two threads, keeping at most ``limit`` bytes of both together."""

    def __init__(self, proc: subprocess.Popen, limit: int) -> None:
        self.limit, self.proc = limit, proc
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.kept, self.overflow, self.lock = 0, False, threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in self.chunks]
        for thread in self.threads:
            thread.start()

    def _read(self, name: str) -> None:
        stream = getattr(self.proc, name)
        while chunk := stream.read1(65536):
            with self.lock:
                room = self.limit - self.kept
                self.chunks[name].append(chunk[:max(room, 0)])
                self.kept += min(len(chunk), max(room, 0))
                if len(chunk) > room and not self.overflow:
                    self.overflow = True
                    _kill_group(self.proc.pid)

    def text(self, name: str) -> str:
        for thread in self.threads:
            thread.join(timeout=2.0)  # a reader still blocked here holds a pipe of an escaped process
        return b"".join(self.chunks[name]).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _environment(folder: str, allow: tuple[str, ...]) -> dict[str, str]:
    env = {name: os.environ[name] for name in allow if name in os.environ}
    env.update(_BASE_ENV, HOME=folder, TMPDIR=folder)
    return env


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
    except (BrokenPipeError, OSError):
        pass  # the program exited (or closed stdin) without reading it all
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _read_report(fd: int) -> list[str]:
    """The bootstrap's lines; non-blocking, since a process that escaped the group kill may hold the pipe."""
    os.set_blocking(fd, False)
    parts = []
    try:
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(parts).decode("utf-8", errors="replace").splitlines()


def _classify(returncode: int, timed_out: bool, overflow: bool, reported: list[str]) -> str:
    """One reason for the run, the most specific evidence first."""
    if timed_out:
        return "timeout"
    reasons = [line.split(":", 1)[1] for line in reported if line.startswith("reason:")]
    if reasons:
        return reasons[0]  # a refusal the bootstrap saw, even when the program caught the exception
    if overflow:
        return "file_size"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"  # SIGKILL not sent by us: the RLIMIT_CPU hard limit, one second past the soft one
    if returncode < 0 and -returncode in _SIGNAL_REASONS:
        return _SIGNAL_REASONS[-returncode]
    return "ok" if returncode == 0 else "error"


def _reached_file_limit(folder: str, limit: int, placed: dict[str, int], max_entries: int = 10_000) -> bool:
    """A file the program wrote in ``folder`` stopped at ``RLIMIT_FSIZE`` (the error may have been
    swallowed, e.g. by a file closed during garbage collection, where Python only prints it).
    ``placed``: path -> size of the files the sandbox put there (main.py may exceed the limit)."""
    seen = 0
    for root, _, names in os.walk(folder):
        for name in names:
            seen += 1
            if seen > max_entries:
                return False
            path = os.path.join(root, name)
            try:
                size = os.lstat(path).st_size
            except OSError:
                continue
            if size >= limit > 0 and placed.get(path) != size:
                return True
    return False


_warned: set[str] = set()


def _warn_missing_layers(layers: tuple[str, ...]) -> None:
    """Say once per process which kernel layer this machine lacks (docs/sandbox.md: what then holds)."""
    if "rlimits" not in layers:
        return  # the child died before reporting (e.g. killed at start): nothing learnt about the machine
    for layer, fallback in (("seccomp", "new processes are refused only by the audit hook (and RLIMIT_NPROC "
                                        "when not root)"),
                            ("landlock", "writes outside the folder are refused only by the audit hook")):
        if layer not in layers and layer not in _warned:
            _warned.add(layer)
            logger.warning("code sandbox: no %s on this machine; %s", layer, fallback)


def _launch(folder: str, config: SandboxConfig, report_w: int) -> subprocess.Popen:
    settings = {"dir": os.path.realpath(folder), "cpu_s": math.ceil(config.cpu_s or config.timeout_s),
                "memory_bytes": int(config.memory_mb) * _MIB, "file_bytes": int(config.max_file_bytes),
                "report_fd": report_w, "parent_pid": os.getpid()}
    return subprocess.Popen(
        [config.python, "-I", "-S", "-B", _BOOTSTRAP, json.dumps(settings)], cwd=folder,
        env=_environment(settings["dir"], config.env_allow), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, pass_fds=(report_w,), start_new_session=True, close_fds=True)


def _place_files(folder: str, files: dict[str, str]) -> dict[str, int]:
    """Write ``files`` (name -> text) into ``folder``; returns path -> size."""
    placed = {}
    for name, text in files.items():
        target = os.path.join(folder, name)
        if os.path.dirname(os.path.realpath(target)) != os.path.realpath(folder):
            raise ValueError(f"sandbox files key {name!r} must be a plain file name (no folders, no '..')")
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        placed[target] = os.path.getsize(target)
    return placed


def run_python(source: str, stdin: str = "", config: SandboxConfig | dict | None = None,
               files: Optional[dict[str, str]] = None) -> SandboxResult:
    """Run ``source`` as ``main.py`` in a fresh folder under the limits of ``config``.

    Args:
        source: the program (untrusted).
        stdin: its standard input.
        config: the limits (a :class:`SandboxConfig`, a mapping of its fields, or None for defaults).
        files: extra text files to place in the folder first (name -> content), e.g. a test harness.
    """
    config = SandboxConfig.of(config)
    folder = tempfile.mkdtemp(prefix="hybrid_rl_sandbox_")
    report_r, report_w = os.pipe()
    proc = None
    try:
        placed = _place_files(folder, {**(files or {}), "main.py": source})
        start = time.monotonic()
        proc = _launch(folder, config, report_w)
        os.close(report_w)
        report_w = -1
        capture = _Capture(proc, config.max_output_bytes)
        feeder = threading.Thread(target=_feed, args=(proc, stdin.encode("utf-8", errors="replace")), daemon=True)
        feeder.start()
        timed_out = False
        try:
            proc.wait(timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        wall_s = time.monotonic() - start
        _kill_group(proc.pid)  # anything the program left behind in its group
        stdout, stderr = capture.text("stdout"), capture.text("stderr")
        reported = _read_report(report_r)
        reason = _classify(proc.returncode, timed_out, capture.overflow, reported)
        if reason in ("ok", "error") and _reached_file_limit(folder, config.max_file_bytes, placed):
            reason = "file_size"
        layers = tuple(line.split(":", 1)[1] for line in reported if line.startswith("layer:"))
        _warn_missing_layers(layers)
        return SandboxResult(reason, proc.returncode, stdout, stderr, wall_s, layers, proc.pid)
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
            proc.wait()
        for stream in (proc.stdout, proc.stderr) if proc is not None else ():
            stream.close()
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
