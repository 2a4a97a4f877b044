"""The folders the studio may look into, and the code a launched run would execute.

The studio answers questions about the disk (does this path exist? what is in this run folder?) and
launches runs that import user code (a reward file, the classes a tool or agent YAML names, a model
folder's code under ``trust_remote_code``). Both are confined to its *workspace*: the folder it was
started in and the folders given with ``--root`` (a run folder must lie inside them). A path is resolved
(``~``, ``..``, symlinks) before it is compared, so ``ROOT/../..`` or a link out of the workspace is
outside it. A field's own default is always answered: it is the package's path, not one a request chose.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

__all__ = ["REMOTE_CODE_FOLDERS", "CodePath", "Refused", "Workspace", "code_paths", "path_keys", "path_refusals",
           "remote_code_folders"]


class Refused(ValueError):
    """A request the studio refuses: its HTTP status and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


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

    @property
    def roots(self) -> list[Path]:
        """The folders, resolved, in the order given."""
        return list(self._roots)

    def resolve(self, text: str) -> Path:
        """``text`` as an absolute path: ``~`` expanded, relative to :attr:`base`, ``..`` and symlinks resolved."""
        return (self.base / os.path.expanduser(str(text))).resolve()

    def inside(self, path: Path) -> bool:
        """Whether the resolved ``path`` is one of the folders or lies below one."""
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def run_folder(self, run_dir: str) -> Path:
        """The run folder ``run_dir`` names (a run's ``trainer.default_local_dir``), resolved and inside the
        workspace; :class:`Refused` with one line (400 empty / NUL / not a folder, 403 outside) otherwise."""
        if not run_dir.strip():
            raise Refused(400, "run_dir is missing. Fix: give a run's folder (trainer.default_local_dir)")
        if "\x00" in run_dir:
            raise Refused(400, f"run_dir={run_dir!r} holds a NUL character, which no path can. Fix: remove it")
        refusal = self.refusal(run_dir)
        if refusal is not None:
            raise Refused(403, f"run_dir={refusal}")
        folder = self.resolve(run_dir)
        if not folder.is_dir():
            raise Refused(400, f"run_dir={run_dir!r} is not a folder. Fix: give a run's trainer.default_local_dir")
        return folder

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
    """The path, resolved (as the page shows it and the launch's confirmation repeats it); always on this
    machine and confined to the workspace (models are never downloaded)."""
    what: str
    """What the run does with it, in words."""


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


REMOTE_CODE_FOLDERS: dict[str, tuple[str, ...]] = {
    "actor_rollout_ref.model.trust_remote_code": (
        "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "data.tokenizer",
        "distillation.teacher_models.*.model_path"),
    "critic.model.trust_remote_code": ("critic.model.path", "critic.model.tokenizer_path"),
    "reward_model.model.trust_remote_code": ("reward_model.model.path", "reward_model.model.input_tokenizer"),
}
"""Each ``trust_remote_code`` flag and the keys naming the folders a run loads under it (``*``: any
teacher's name): the actor's model and tokenizers (``data.tokenizer`` and the distillation teachers
load with the actor's flag), the critic's, the reward model's. The one place that says which folder's
code a flag lets run: the launch confirms and confines every one of them (:func:`code_paths`), the
checks confine them (:func:`path_keys`)."""


def _matching(leaves: dict[str, Any], pattern: str) -> list[str]:
    """The keys of ``leaves`` that ``pattern`` names (``*`` standing for one key part)."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\*", r"[^.]+") + "$")
    return [key for key in leaves if regex.match(key)]


def remote_code_folders(leaves: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, folder)`` of every folder the run loads with a ``trust_remote_code`` that is true, from
    the composed config's ``leaves`` (:data:`REMOTE_CODE_FOLDERS`); unset keys, URLs and the embedded
    model's id (the package's own, no code of its own) are left out."""
    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID

    found = []
    for flag, patterns in REMOTE_CODE_FOLDERS.items():
        if leaves.get(flag) is not True:
            continue
        for key in (k for pattern in patterns for k in _matching(leaves, pattern)):
            value = leaves[key]
            if isinstance(value, str) and value and "://" not in value and value != EMBEDDED_MODEL_ID:
                found.append((key, value))
    return found


def path_keys(leaves: dict[str, Any], path_fields: Iterable[str]) -> list[str]:
    """The keys of ``leaves`` naming a path: ``path_fields`` (the schema's path fields) and every folder
    key of :data:`REMOTE_CODE_FOLDERS` (a teacher's ``model_path`` lives inside a mapping field)."""
    patterns = [*path_fields, *(p for patterns in REMOTE_CODE_FOLDERS.values() for p in patterns)]
    return list(dict.fromkeys(key for pattern in patterns for key in _matching(leaves, pattern)))


def code_paths(config: dict[str, Any], workspace: Workspace) -> list[CodePath]:
    """The code a run of ``config`` (the composed config as a nested dict) executes: the files of
    :data:`_CODE_KEYS`, any other string value ending in ``.py``, and every folder loaded under a
    ``trust_remote_code: true`` (:func:`remote_code_folders`). Models are never downloaded, so each
    folder is a path on this machine (confined like the files). URLs are no code on disk."""
    leaves = dict(_leaves(config))
    found = []
    for key, value in leaves.items():
        if not isinstance(value, str) or not value or "://" in value:
            continue
        what = _CODE_KEYS.get(key) or ("a Python file" if value.endswith(".py") else None)
        if what:
            found.append(CodePath(key, str(workspace.resolve(value)), what))
    for key, folder in remote_code_folders(leaves):  # a missing folder too: it may appear before the run loads it
        found.append(CodePath(key, str(workspace.resolve(folder)),
                              "a model or tokenizer folder whose own code runs (trust_remote_code=true)"))
    return found


def path_refusals(config: dict[str, Any], defaults: dict[str, Any], path_fields: Iterable[str],
                  workspace: Workspace) -> dict[str, str]:
    """``{field key: "key=<refusal>"}`` of the paths in the composed ``config`` (nested dicts, interpolations
    resolved) that lie outside ``workspace``: every key :func:`path_keys` names (a list's items and a glob's
    folder too) whose value differs from ``defaults`` (the composed defaults' leaves: a field's own default
    is the package's, not a request's). URLs are no paths, but for a ``sqlite:///`` URL's file; a path
    is refused once (``critic.model.path`` follows the actor's). A teacher's ``model_path`` is filed
    under its mapping field, ``distillation.teacher_models``."""
    leaves, fields = dict(_leaves(config)), list(path_fields)
    refused: dict[str, str] = {}
    named: set[str] = set()  # a path refused once is not refused again under a key that follows it
    for key in path_keys(leaves, fields):
        value = leaves[key]
        if value == defaults.get(key, object()):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and item.startswith("sqlite:///"):  # the experience buffer's database file
                item = item[len("sqlite:///"):].split("?", 1)[0]
            if not isinstance(item, str) or not item or "://" in item or item in named:
                continue
            refusal = workspace.refusal(item)
            if refusal is not None:
                named.add(item)
                owner = key if key in fields else ".".join(key.split(".")[:2])  # distillation.teacher_models
                refused.setdefault(owner, f"{key}={refusal}")
                break
    return refused
