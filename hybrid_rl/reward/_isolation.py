"""Run a list of zero-argument callables in order, each bounded by a timeout, and never hang.

Both backends follow one pattern: a single *runner* (child process or daemon thread) executes the
callables in order and reports each result as it finishes; the caller waits at most ``timeout_s`` for
each report. When a callable overruns, the runner is abandoned (process: SIGKILL; thread: left to
finish on its own), that item is reported as a timeout, and a fresh runner continues with the next
item. So the common case costs one runner per call of :func:`run_bounded`, not one per item.

Trade-offs (why ``process`` is the default on POSIX):

* ``process`` (``os.fork``): survives anything the callable does -- infinite loops, a C routine that
  holds the GIL (``10**10**10`` inside sympy, catastrophic regexes), segfaults, ``os._exit``, memory
  blow-ups -- because the child is killed. Costs one fork per call (~30 ms with a few hundred MB
  resident) and side effects of the callable (global caches, counters) stay in the child. Results
  must be picklable. Forking a multi-threaded process is POSIX-legal but a lock held by another
  thread at fork time could deadlock the child; that too ends as a timeout, never a hang.
* ``thread``: cheap, shares memory, works everywhere, but Python cannot interrupt a thread: a hung
  callable keeps running in the background (at most ``MAX_ABANDONED_THREADS`` alive at once, further
  items are refused as timeouts), and a callable stuck in GIL-holding C code stalls the whole
  interpreter, so the timeout cannot fire. Use it only for scorers known to be pure Python.
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import signal
import struct
import sys
import threading
import time
from typing import Any, Callable, Sequence

ISOLATION_MODES = ("process", "thread")
MAX_ABANDONED_THREADS = 4
STARTUP_TIMEOUT_S = 30.0
_HEADER = struct.Struct("<Q")
_abandoned_threads: list[threading.Thread] = []
_abandoned_lock = threading.Lock()

# Result records: ("ok", value) | ("timeout", message) | ("error", message)
Record = tuple[str, Any]


def default_isolation() -> str:
    """``process`` where ``os.fork`` exists, else ``thread``."""
    return "process" if hasattr(os, "fork") else "thread"


def run_bounded(thunks: Sequence[Callable[[], Any]], timeout_s: float, isolation: str) -> list[Record]:
    """Call each thunk (in order); each gets ``timeout_s`` seconds. Returns one record per thunk.

    Thunks are expected to catch their own exceptions; one that raises anyway yields an ``error``
    record. ``timeout_s <= 0`` disables the bound (in-process direct calls).
    """
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"reward isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    if timeout_s is None or timeout_s <= 0:
        return [_call(thunk) for thunk in thunks]
    start_runner = _ProcessRunner if isolation == "process" else _ThreadRunner
    records: list[Record | None] = [None] * len(thunks)
    next_idx = 0
    while next_idx < len(thunks):
        if isolation == "thread" and _num_abandoned_threads() >= MAX_ABANDONED_THREADS:
            msg = f"refused: {MAX_ABANDONED_THREADS} earlier scorer threads are still hung"
            records[next_idx:] = [("timeout", msg)] * (len(thunks) - next_idx)
            break
        runner = start_runner(thunks, next_idx)
        try:
            # The first item's budget starts once the runner is up: under heavy load a fork can
            # take longer than a short per-item timeout, which must not count against the scorer.
            if runner.wait_ready(STARTUP_TIMEOUT_S):
                next_idx = _drain(runner, records, next_idx, len(thunks), timeout_s)
            else:
                records[next_idx] = ("error", f"scorer process did not start within {STARTUP_TIMEOUT_S}s")
                next_idx += 1
        finally:
            runner.close()
    return records  # type: ignore[return-value]


def _drain(runner, records: list, idx: int, n: int, timeout_s: float) -> int:
    """Collect the runner's records from ``idx`` on; return the index to restart from."""
    while idx < n:
        got = runner.get(timeout_s)
        if got is None:  # overran its time: abandon the runner, skip the item
            records[idx] = ("timeout", f"no result within {timeout_s:g}s")
            runner.abandon()
            return idx + 1
        if got[0] == "died":
            records[idx] = ("error", got[1])
            return idx + 1
        idx_done, record = got
        records[idx_done] = record
        idx = idx_done + 1
    return idx


def _call(thunk: Callable[[], Any]) -> Record:
    try:
        return ("ok", thunk())
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 -- SystemExit from a scorer must not end training
        return ("error", f"{type(exc).__name__}: {exc}")


def _num_abandoned_threads() -> int:
    with _abandoned_lock:
        _abandoned_threads[:] = [t for t in _abandoned_threads if t.is_alive()]
        return len(_abandoned_threads)


class _ThreadRunner:
    """Runs ``thunks[start:]`` in one daemon thread, posting ``(idx, record)`` to a queue."""

    def __init__(self, thunks: Sequence[Callable[[], Any]], start: int) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(thunks, start), daemon=True,
                                        name="hybrid_rl-reward-guard")
        self._thread.start()

    def _run(self, thunks, start) -> None:
        for idx in range(start, len(thunks)):
            if self._stop.is_set():
                return
            self._queue.put((idx, _call(thunks[idx])))

    def wait_ready(self, timeout_s: float) -> bool:
        return True  # a thread starts at once

    def get(self, timeout_s: float):
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def abandon(self) -> None:
        self._stop.set()  # the thread exits after its current (hung) item, if it ever returns
        with _abandoned_lock:
            _abandoned_threads.append(self._thread)

    def close(self) -> None:
        self._stop.set()


class _ProcessRunner:
    """Runs ``thunks[start:]`` in a forked child that streams length-prefixed pickled records."""

    def __init__(self, thunks: Sequence[Callable[[], Any]], start: int) -> None:
        # Flush now so buffered parent output is not written twice (once by each process).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 -- a closed/odd stream must not block scoring
                pass
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(read_fd)
            _child_main(thunks, start, write_fd)
        os.close(write_fd)
        self._pid, self._fd, self._buf, self._eof = pid, read_fd, bytearray(), False

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the child reported it is running (its first record is ``(-1, ("ready", None))``)."""
        got = self.get(timeout_s)
        return got is not None and got[0] == -1

    def get(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._pop_message()
            if message is not None:
                return pickle.loads(message)
            if self._eof:
                return ("died", f"scorer process exited unexpectedly ({self._exit_reason()})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                self._eof = not chunk
                self._buf += chunk

    def _pop_message(self) -> bytes | None:
        if len(self._buf) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._buf)
        if len(self._buf) < _HEADER.size + size:
            return None
        message = bytes(self._buf[_HEADER.size : _HEADER.size + size])
        del self._buf[: _HEADER.size + size]
        return message

    def _exit_reason(self) -> str:
        try:
            _, status = os.waitpid(self._pid, 0)
        except ChildProcessError:  # SIGCHLD ignored by the host process: already reaped
            self._pid = None
            return "exit status unknown"
        self._pid = None
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit code {os.waitstatus_to_exitcode(status)}"

    def abandon(self) -> None:
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        os.close(self._fd)
        if self._pid is None:
            return
        # Normally the child has sent everything and is exiting: give it a moment to flush the
        # scorer's own output, then make sure it is gone so the final reap cannot block.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if _reap(self._pid, os.WNOHANG):
                self._pid = None
                return
            time.sleep(0.001)
        self.abandon()
        _reap(self._pid, 0)
        self._pid = None


def _reap(pid: int, flags: int) -> bool:
    """waitpid that treats "no such child" (SIGCHLD set to SIG_IGN by the host) as reaped."""
    try:
        return os.waitpid(pid, flags) != (0, 0)
    except ChildProcessError:
        return True


def _frame(obj: Any) -> bytes:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child_main(thunks: Sequence[Callable[[], Any]], start: int, write_fd: int) -> None:
    code = 0
    try:
        # Ctrl-C goes to the whole process group: let the parent handle it, the child just dies.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _write_all(write_fd, _frame((-1, ("ready", None))))
        for idx in range(start, len(thunks)):
            record = _call(thunks[idx])
            try:
                message = _frame((idx, record))
            except Exception as exc:  # noqa: BLE001 -- e.g. a scorer returned a lock or generator
                message = _frame((idx, ("error", f"result not picklable: {exc}")))
            _write_all(write_fd, message)
        os.close(write_fd)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the scorer's own prints
    except BaseException:  # noqa: BLE001 -- nothing may escape into the parent's code path
        code = 1
    finally:
        os._exit(code)
