"""Shared-memory segments for weight buckets: files under ``/dev/shm`` (mode 0600, owner only).

Names: ``hybrid_rl_wt_<pid>_<nonce>_<counter>``: the pid lets a later process tell the leftovers of
a dead exporter (a worker killed with SIGKILL never unlinks) and sweep them at start; the random
per-process nonce keeps two hosts' (or containers') equal pids from ever naming the same file.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import secrets
import threading
from typing import Optional

__all__ = ["SEGMENT_PREFIX", "SHM_DIR", "create_segment", "map_readonly", "recycle_segment", "sweep_dead_segments",
           "unlink_segment"]

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "hybrid_rl_wt_"
_counter = itertools.count()
_counter_lock = threading.Lock()
_NONCE = secrets.token_hex(4)


def _next_path(directory: str) -> str:
    with _counter_lock:
        number = next(_counter)
    return os.path.join(directory, f"{SEGMENT_PREFIX}{os.getpid()}_{_NONCE}_{number}")


def create_segment(size: int, directory: str = SHM_DIR, spare: Optional[str] = None) -> tuple[str, mmap.mmap]:
    """A segment of at least ``size`` bytes and its writable mapping: ``spare`` (a released
    segment, grown if needed: its pages are already allocated, so no page faults) or a new file
    (created exclusively, mode 0600)."""
    if not os.path.isdir(directory):
        raise ValueError(f"weight transfer: shared-memory directory {directory!r} does not exist. Fix: run on "
                         "Linux with /dev/shm mounted, or export with transport='object_store'.")
    path = spare or _next_path(directory)
    flags = os.O_RDWR | os.O_NOFOLLOW | (0 if spare else os.O_CREAT | os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask: only the owner may map the weights
        size = max(size, 1, os.fstat(fd).st_size)
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        unlink_segment(path)
        raise
    os.close(fd)  # the mapping keeps the memory; the name keeps the file
    return path, mapping


def recycle_segment(path: str) -> Optional[str]:
    """Rename a released segment (a reader holding the old handle then finds it gone instead of
    reading a newer push) and return its new name, for the next push to write into."""
    fresh = _next_path(os.path.dirname(path))
    try:
        os.rename(path, fresh)
    except FileNotFoundError:
        return None
    return fresh


def map_readonly(path: str, size: int) -> mmap.mmap:
    """Map an exporter's segment for reading. Copy-on-write (``ACCESS_COPY``): the engine reads the
    shared pages in place, and a stray write lands in a private page, never in the segment."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ValueError(f"weight transfer: bucket {path!r} is gone (released, or the exporter is on another "
                         "node). Fix: release a push only after every rollout worker loaded it, and use "
                         "transport='object_store' when the rollout runs on another node.") from None
    try:
        return mmap.mmap(fd, max(size, 1), access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def unlink_segment(path: str) -> None:
    """Remove a segment's name (mappings stay valid until closed); a missing file is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_dead_segments(directory: str = SHM_DIR) -> int:
    """Unlink the segments whose exporting process is gone; returns how many."""
    if not os.path.isdir(directory):
        return 0
    swept = 0
    for name in os.listdir(directory):
        if not name.startswith(SEGMENT_PREFIX):
            continue
        pid_text = name[len(SEGMENT_PREFIX):].split("_", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            unlink_segment(os.path.join(directory, name))
            swept += 1
    if swept:
        logger.info("weight transfer: swept %d shared-memory segments left by dead processes", swept)
    return swept
