"""The folders the studio may look into, and the code a launched run would execute.

The studio answers questions about the disk (does this path exist? what is in this run folder?) and
launches runs that import user code (a reward file, the classes a tool or agent YAML names, a model
folder's code under ``trust_remote_code``). Both are confined to its *workspace*: the folder it was
started in, the folders given with ``--root``, and the run folders it launched. A path is resolved
(``~``, ``..``, symlinks) before it is compared, so ``ROOT/../..`` or a link out of the workspace is
outside it. A field's own default is always answered: it is the package's path, not one a request chose.
"""

from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

__all__ = ["CodePath", "Workspace", "code_paths"]


class Workspace:
    """The studio's folders: paths inside them are answered, paths outside are refused."""

    def __init__(self, roots: Iterable[str], base: Optional[str] = None):
        self.base = Path(base or os.getcwd()).resolve()
        """Where a relative path starts (the studio's working folder; launched runs start there too)."""
        self._roots = [self.resolve(r) for r in roots] or [self.base]
        for given, root in zip(roots, self._roots):
            if not root.is_dir():
                raise ValueError(f"--root {given}: {root} is not a folder. Fix: give an existing folder the studio "
                                 "may read and run code from")
        self._lock = threading.Lock()  # FastAPI runs plain endpoints in a thread pool

    @property
    def roots(self) -> list[Path]:
        """The folders, resolved, in the order added."""
        with self._lock:
            return list(self._roots)

    def add(self, folder: Path) -> None:
        """Open ``folder`` too (a run folder the studio launched a run in)."""
        folder = self.resolve(str(folder))
        with self._lock:
            if folder not in self._roots:
                self._roots.append(folder)

    def resolve(self, text: str) -> Path:
        """``text`` as an absolute path: ``~`` expanded, relative to :attr:`base`, ``..`` and symlinks resolved."""
        return (self.base / os.path.expanduser(str(text))).resolve()

    def inside(self, path: Path) -> bool:
        """Whether the resolved ``path`` is one of the folders or lies below one."""
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def refusal(self, text: str) -> Optional[str]:
        """None when ``text`` names a path inside the workspace, else the one-line reason it is refused
        (starting with ``text``, so a caller can put ``key=`` in front).
        A glob is judged by the folder before its first wildcard; ``..`` after a wildcard is refused
        (where it leads depends on what the wildcard matches)."""
        if "\x00" in str(text):
            return f"{text!r} holds a NUL character, which no path can. Fix: remove it"
        parts = Path(os.path.expanduser(str(text))).parts
        magic = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
        if magic is not None and ".." in parts[magic:]:
            return f"{text!r}: '..' after a wildcard is refused. Fix: write the folder without '..'"
        if magic is None:
            path = self.resolve(str(text))
        else:  # the folder the pattern lists
            path = self.resolve(os.path.join(*parts[:magic])) if magic else self.base
        if self.inside(path):
            return None
        where = ", ".join(str(r) for r in self.roots)
        named = f"{text!r}" + (f" (= {path})" if str(path) != str(text) else "")
        return (f"{named} is outside the studio's folders ({where}); the studio neither reads "
                f"nor runs anything outside them. Fix: use a path under {self.roots[0]}, or restart the studio "
                "with --root naming a folder that holds it")  # no hint from the disk: nothing outside is looked at

    def glob_inside(self, text: str) -> bool:
        """Whether the pattern ``text`` (already judged by :meth:`refusal`) matches a path that resolves
        inside the workspace (a link out of it is no match); stops at the first."""
        pattern = str(self.base / os.path.expanduser(str(text)))
        return any(self.inside(Path(match).resolve()) for match in glob.iglob(pattern))


@dataclass(frozen=True)
class CodePath:
    """A path whose code a launched run executes."""

    key: str
    """The config key that names it."""
    path: str
    """The path, resolved (as the page shows it and the launch's confirmation repeats it)."""
    what: str
    """What the run does with it, in words."""
    local: bool = True
    """A path on this machine (confined to the workspace); False for a hub model's id."""


_CODE_KEYS = {
    "custom_reward_function.path": "a Python file the run imports (its reward function)",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": "a YAML whose tool classes the run imports",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "a YAML whose interaction classes the run imports",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "a YAML whose agent-loop classes the run imports",
}
"""Keys naming a file that makes the run import code (veRL's names)."""


def _leaves(tree: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a nested mapping."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _leaves(value, key + ".")
        else:
            yield key, value


def code_paths(config: dict[str, Any], workspace: Workspace) -> list[CodePath]:
    """The code a run of ``config`` (the composed config as a nested dict) executes: the files of
    :data:`_CODE_KEYS`, any other string value ending in ``.py``, and the model folder beside every
    ``trust_remote_code: true``. URLs and the embedded model's id are no code on disk."""
    leaves = dict(_leaves(config))
    found = []
    for key, value in leaves.items():
        if not isinstance(value, str) or not value or "://" in value:
            continue
        what = _CODE_KEYS.get(key) or ("a Python file" if value.endswith(".py") else None)
        if what:
            found.append(CodePath(key, str(workspace.resolve(value)), what))
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID

    for key, value in leaves.items():
        folder_key = key.rsplit(".", 1)[0] + ".path"
        folder = leaves.get(folder_key)
        if (key.endswith("trust_remote_code") and value is True and isinstance(folder, str) and "://" not in folder
                and folder != EMBEDDED_MODEL_ID):  # the embedded model is the package's own, no remote code
            if workspace.resolve(folder).is_dir():
                found.append(CodePath(folder_key, str(workspace.resolve(folder)),
                                      "a model folder whose own code runs (trust_remote_code=true)"))
            else:  # a hub id: the code comes from the hub
                found.append(CodePath(folder_key, folder, "a hub model whose own code runs (trust_remote_code=true)",
                                      local=False))
    return found
