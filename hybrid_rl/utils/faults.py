"""Test-only fault injection: kill, hang or fail a process at a named point of a training step.

Production runs never set ``HYBRID_RL_FAULT``; then :func:`inject` is one dictionary lookup. The
reliability tests (``tests/reliability/``) set it on the command line::

    HYBRID_RL_FAULT="kill:update_actor:2"            SIGKILL the worker(s) entering update_actor at step 2
    HYBRID_RL_FAULT="kill:save_checkpoint:2:1"       ... only rank 1 (rank 0 is left mid-write)
    HYBRID_RL_FAULT="hang:generate_sequences:2:0"    rank 0 sleeps forever in generate_sequences
    HYBRID_RL_FAULT="oserror:save_checkpoint:2"      raise OSError(ENOSPC) as a full disk would
    HYBRID_RL_FAULT="kill:driver.commit:2"           SIGKILL the driver after the workers saved step 2,
                                                     before the step is marked complete

Format: ``action:point:step[:rank]``, several separated by ``,``. ``rank`` is the worker's ``RANK``
(the driver has none: omit it). Points: the worker methods ``generate_sequences``, ``stream_load_weights``, ``update_actor``,
``save_checkpoint``; the driver's ``driver.<step name>`` (before each named step of
``RayPPOTrainer.step_plan``) and ``driver.commit``.

With ``HYBRID_RL_FAULT_STATE=<dir>`` each fault fires once per run directory (a marker file is
created atomically before it fires), so a restarted or resumed run passes the point unharmed.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

FAULT_ENV = "HYBRID_RL_FAULT"
STATE_ENV = "HYBRID_RL_FAULT_STATE"
ACTIONS = ("kill", "hang", "oserror")


@dataclass(frozen=True)
class Fault:
    """One parsed entry of ``HYBRID_RL_FAULT``."""

    action: str
    """kill (SIGKILL this process) | hang (sleep forever) | oserror (raise OSError ENOSPC)."""
    point: str
    """Where it fires: a worker method name or ``driver.<step>``."""
    step: int
    """Training step (``global_steps``) at which it fires."""
    rank: Optional[int] = None
    """Only this worker rank (None = every process reaching the point)."""

    @property
    def marker(self) -> str:
        return f"{self.action}-{self.point}-{self.step}-{self.rank}".replace("/", "_")


def parse_faults(spec: str) -> list[Fault]:
    """``"kill:update_actor:2,hang:generate_sequences:3:0"`` -> faults (ValueError on a typo)."""
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[0] not in ACTIONS or not all(p.isdigit() for p in parts[2:]):
            raise ValueError(f"{FAULT_ENV} entry {item!r} is not action:point:step[:rank] with action in "
                             f"{ACTIONS}, e.g. kill:update_actor:2")
        faults.append(Fault(parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else None))
    return faults


def _first_time(fault: Fault) -> bool:
    """True unless ``HYBRID_RL_FAULT_STATE`` says this fault already fired (then never again)."""
    state_dir = os.environ.get(STATE_ENV)
    if not state_dir:
        return True
    os.makedirs(state_dir, exist_ok=True)
    try:
        os.close(os.open(os.path.join(state_dir, fault.marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def inject(point: str, step: Optional[int]) -> None:
    """Fire the fault configured for ``point`` at ``step`` in this process, if any (test-only)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or step is None:
        return
    rank = os.environ.get("RANK")
    for fault in parse_faults(spec):
        if fault.point != point or fault.step != int(step):
            continue
        if fault.rank is not None and (rank is None or int(rank) != fault.rank):
            continue
        if _first_time(fault):
            _fire(fault)


def _fire(fault: Fault) -> None:
    logger.warning("fault injection (%s): %s at %s, step %d, pid %d", FAULT_ENV, fault.action, fault.point,
                   fault.step, os.getpid())
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "hang":
        while True:
            time.sleep(3600)
    else:
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAULT_ENV} at {fault.point})")
