"""Run-level checkpoint layout, atomic commit, rotation and resume resolution.

Layout under ``trainer.default_local_dir``::

    global_step_N/actor/            written by the actor workers (model, optimizer, extra)
    global_step_N/critic/           written by the critic workers (GAE runs)
    global_step_N/trainer_state.json  driver state: step, dataloader position, RNG, KL controller
    latest_checkpointed_iteration.txt  "N" of the newest *complete* checkpoint

A step's save is complete once ``trainer_state.json`` exists: the driver writes it (atomically,
temp file + rename) only after every worker returned from its save. The pointer file is rewritten
(again temp + rename) after that, so a crash at any moment leaves the pointer on a complete
checkpoint. The driver state is plain JSON: nothing from a checkpoint is ever unpickled.

Before training, :meth:`CheckpointManager.probe` checks that the folder is writable and has room for
one more checkpoint (:func:`estimate_checkpoint_bytes`). A save that fails (disk full, permissions)
is abandoned with :meth:`CheckpointManager.abort`: its folder is removed and the pointer keeps naming
the previous complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from hybrid_rl.trainer.config.run_checks import RESUME_MODES  # re-exported: the checkpoints' vocabulary

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# Bytes per parameter of each checkpoint part: fp32 weights; AdamW exp_avg + exp_avg_sq in fp32.
_BYTES_PER_PARAM = {"model": 4, "optimizer": 8, "hf_model": 4, "extra": 0}
_FIXED_BYTES = 64 * 2**20  # tokenizer, HF config, RNG/LR state, JSON metadata


def estimate_checkpoint_bytes(num_params: int, contents_per_model: list[list[str]]) -> int:
    """Rough size of one ``global_step_N`` folder: ``num_params`` per saved model (actor, critic, ...)
    times the bytes of the parts each saves (its ``checkpoint.save_contents``)."""
    per_model = [num_params * sum(_BYTES_PER_PARAM.get(part, 0) for part in parts) for parts in contents_per_model]
    return sum(per_model) + _FIXED_BYTES * len(contents_per_model)


def _atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` so that readers see either the old or the new content, never a mix."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def capture_rng_state() -> dict[str, Any]:
    """The driver's Python, numpy and torch CPU RNG states as JSON-serialisable values."""
    np_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


class CheckpointSaveError(RuntimeError):
    """Writing a checkpoint failed (disk full, permissions); the previous checkpoint stays valid."""


@dataclass
class ResumePoint:
    """Where a run continues from: the step folder and the driver state saved in it."""

    step_dir: str
    global_step: int
    state: dict[str, Any]


class CheckpointManager:
    """Owns ``default_local_dir``: step folders, the latest pointer, rotation and resume lookup."""

    def __init__(self, root: str, max_to_keep: Optional[int] = None):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(
                f"trainer.max_actor_ckpt_to_keep={max_to_keep} must be >= 1 or null (keep all); "
                "a run must keep at least the checkpoint it would resume from"
            )
        self.root = os.path.abspath(os.path.expanduser(root))
        self.max_to_keep = max_to_keep

    # ------------------------------------------------------------------ layout
    def step_dir(self, step: int) -> str:
        return os.path.join(self.root, f"global_step_{step}")

    def actor_dir(self, step: int) -> str:
        return os.path.join(self.step_dir(step), "actor")

    def critic_dir(self, step: int) -> str:
        return os.path.join(self.step_dir(step), "critic")

    @staticmethod
    def is_complete(step_dir: str) -> bool:
        return os.path.isfile(os.path.join(step_dir, STATE_FILE))

    def list_steps(self) -> list[int]:
        """Steps with a ``global_step_N`` folder (complete or not), ascending."""
        if not os.path.isdir(self.root):
            return []
        steps = [int(m.group(1)) for name in os.listdir(self.root) if (m := _STEP_DIR.match(name))]
        return sorted(steps)

    def latest_step(self) -> Optional[int]:
        """The step named by the pointer file, or None when no checkpoint was committed."""
        path = os.path.join(self.root, LATEST_FILE)
        if not os.path.isfile(path):
            return None
        text = open(path, encoding="utf-8").read().strip()
        if not text.isdigit():
            raise ValueError(
                f"{path} contains {text!r}, not a step number; delete the file to start fresh or set "
                "trainer.resume_mode=resume_path with trainer.resume_from_path=<a global_step_N folder>"
            )
        return int(text)

    # ------------------------------------------------------------------ saving
    def begin(self, step: int) -> str:
        """Prepare an empty folder for step ``step`` (a partial one from a crashed save is removed)."""
        step_dir = self.step_dir(step)
        if os.path.isdir(step_dir):
            if self.latest_step() == step:
                # Re-doing a committed step (the run resumed from an older resume_path): move the
                # pointer back first so it never names a folder that is being rewritten.
                older = [s for s in self.list_steps() if s < step and self.is_complete(self.step_dir(s))]
                if older:
                    _atomic_write_text(os.path.join(self.root, LATEST_FILE), str(older[-1]))
                else:
                    os.remove(os.path.join(self.root, LATEST_FILE))
            shutil.rmtree(step_dir)
        os.makedirs(step_dir)
        return step_dir

    def commit(self, step: int, state: dict[str, Any]) -> None:
        """Mark step ``step`` complete (after all workers saved) and rotate old checkpoints."""
        step_dir = self.step_dir(step)
        assert os.path.isdir(step_dir), f"commit({step}) without begin({step})"
        payload = dict(state, global_step=step)
        _atomic_write_text(os.path.join(step_dir, STATE_FILE), json.dumps(payload))
        _atomic_write_text(os.path.join(self.root, LATEST_FILE), str(step))
        self.rotate()

    def rotate(self) -> None:
        """Delete complete checkpoints older than the newest ``max_to_keep`` ones."""
        if self.max_to_keep is None:
            return
        latest = self.latest_step()
        complete = [s for s in self.list_steps() if self.is_complete(self.step_dir(s)) and (latest is None or s <= latest)]
        for step in complete[: -self.max_to_keep]:
            logger.info("Removing old checkpoint %s", self.step_dir(step))
            shutil.rmtree(self.step_dir(step), ignore_errors=True)

    def abort(self, step: int, error: BaseException) -> CheckpointSaveError:
        """Drop the folder of a save that failed with ``error``; the error to raise, naming the
        checkpoint that stays the resume point."""
        if self.latest_step() != step:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
        cause = getattr(error, "cause", None) or error  # a worker's OSError arrives wrapped by Ray
        reason = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        latest = self.latest_step()
        kept = f"{self.step_dir(latest)} stays the resume point" if latest is not None else "no earlier checkpoint"
        return CheckpointSaveError(
            f"could not write checkpoint {self.step_dir(step)} (trainer.default_local_dir={self.root}): {reason}. "
            f"The partial folder was removed and {kept}. Free disk space or fix the folder's permissions (or set "
            "trainer.default_local_dir to another folder), then rerun the same command to resume.")

    def probe(self, required_bytes: int) -> None:
        """ValueError unless ``root`` is writable and has ``required_bytes`` free (one more checkpoint)."""
        fix = "set trainer.default_local_dir to a writable folder with room for it, or trainer.save_freq=-1"
        try:
            os.makedirs(self.root, exist_ok=True)
            _atomic_write_text(os.path.join(self.root, ".write_probe"), "ok")
            os.remove(os.path.join(self.root, ".write_probe"))
        except OSError as error:
            raise ValueError(f"trainer.default_local_dir={self.root} is not writable ({error.strerror or error}); "
                             f"checkpoints could not be saved: {fix}") from error
        free = shutil.disk_usage(self.root).free
        if free < required_bytes:
            raise ValueError(
                f"trainer.default_local_dir={self.root} has {free / 2**30:.2f} GiB free but one checkpoint needs "
                f"about {required_bytes / 2**30:.2f} GiB (model + optimizer state); free some space or {fix}")

    # ------------------------------------------------------------------ resuming
    def resolve_resume(self, mode: str, resume_from_path: Optional[str]) -> Optional[ResumePoint]:
        """The checkpoint to resume from under ``trainer.resume_mode``, or None to start fresh."""
        if mode not in RESUME_MODES:
            raise ValueError(f"trainer.resume_mode={mode!r} is not one of {RESUME_MODES}")
        if mode == "disable":
            return None
        if mode == "resume_path":
            if not resume_from_path:
                raise ValueError(
                    "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>; "
                    "set it, or use resume_mode=auto to pick the latest checkpoint"
                )
            return self.load_point(resume_from_path)
        latest = self.latest_step()
        if latest is None:
            return None
        return self.load_point(self.step_dir(latest))

    def load_point(self, step_dir: str) -> ResumePoint:
        """Read the driver state of a complete ``global_step_N`` folder (ValueError otherwise)."""
        step_dir = os.path.abspath(os.path.expanduser(step_dir))
        match = _STEP_DIR.match(os.path.basename(step_dir.rstrip("/")))
        if not os.path.isdir(step_dir) or match is None:
            raise ValueError(
                f"resume checkpoint {step_dir} is not a global_step_N folder; point "
                "trainer.resume_from_path at one (e.g. <default_local_dir>/global_step_10)"
            )
        if not self.is_complete(step_dir):
            raise ValueError(
                f"checkpoint {step_dir} is incomplete (no {STATE_FILE}: its save was interrupted); "
                "resume from an earlier global_step_N folder"
            )
        path = os.path.join(step_dir, STATE_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            step = int(state["global_step"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a valid driver state ({type(error).__name__}: {error}); the file is "
                             "corrupt or was replaced: resume from an earlier global_step_N folder") from error
        return ResumePoint(step_dir=step_dir, global_step=step, state=state)
