"""A frozen module's weights in a file mapping that leaves the process's memory between uses.

A reference policy is read once per step (``compute_ref_log_prob``) and idle while the actor
trains, which is when a CPU worker's memory peaks. :class:`FileMappedWeights` writes the module's
parameters once to a file, maps that file privately (``MAP_PRIVATE``, copy-on-write) and points
every parameter at its bytes in the mapping. :meth:`FileMappedWeights.release` then drops the
pages from the process (``madvise(MADV_DONTNEED)``); the next forward faults them back in from the
kernel's page cache, or from the disk if the kernel reclaimed the cache meanwhile. Nothing writes a
frozen module's weights; were something to, the write would stay private to the process and be
discarded at the next release.

The file is unlinked as soon as it is mapped: it takes no name on disk and vanishes with the
process, even after a crash. It must live on a disk-backed file system: on tmpfs (RAM) the pages
would still take memory, only not this process's (:func:`ram_file_system`).
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from typing import Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

_ALIGN = 64  # bytes: every tensor starts on a cache line
_RAM_FILE_SYSTEMS = ("tmpfs", "ramfs")


def ram_file_system(directory: str, mountinfo: Optional[str] = None) -> Optional[str]:
    """``"tmpfs"``/``"ramfs"`` when ``directory`` lives in memory, else None: the file system of the
    longest mount point holding it in ``mountinfo`` (default: ``/proc/self/mountinfo``; None where
    that cannot be read)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return None
    mounts = [line.split() for line in mountinfo.splitlines() if " - " in line]
    real, best, fs_type = os.path.realpath(directory), "", None
    for fields in mounts:
        mount_point, fs = fields[4], fields[fields.index("-") + 1]
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, fs_type = mount_point, fs
    return fs_type if fs_type in _RAM_FILE_SYSTEMS else None


class FileMappedWeights:
    """Moves ``module``'s parameters into a private mapping of an unlinked file in ``directory``
    (default: the system's temporary directory). Tied parameters stay tied (one copy each)."""

    def __init__(self, module: nn.Module, directory: Optional[str] = None):
        directory = directory or tempfile.gettempdir()
        params = [p for p in {id(p): p for p in module.parameters()}.values() if p.numel()]
        offsets, size = [], 0
        for p in params:
            offsets.append(size)
            size += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
        fd, path = tempfile.mkstemp(prefix="hybrid_rl_weights_", dir=directory)
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                for p, offset in zip(params, offsets):
                    f.seek(offset)
                    f.write(p.detach().contiguous().view(torch.uint8).reshape(-1).numpy())  # no bytes copy
                f.truncate(max(size, 1))
            self._mm = mmap.mmap(fd, max(size, 1), access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
            os.unlink(path)
        for p, offset in zip(params, offsets):
            nbytes = p.numel() * p.element_size()
            p.data = torch.frombuffer(self._mm, dtype=torch.uint8, count=nbytes, offset=offset).view(p.dtype).view(p.shape)
        self.nbytes = size
        self.release()  # the pages written above are in the page cache, not (yet) this process's

    def release(self) -> None:
        """Drop the mapped pages from this process; the next read faults them back in."""
        self._mm.madvise(mmap.MADV_DONTNEED)
