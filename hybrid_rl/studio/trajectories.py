"""The trajectory viewer's routes: a run's dumped steps, a step's prompt groups, a group's responses.

A run is a folder the studio watches (``trainer.default_local_dir``, as ``/api/watch`` takes it). Its
dump folders are the run's ``trainer.rollout_data_dir`` (``train``) and ``trainer.validation_data_dir``
(``val``), read from the config the studio launched it with (``studio_config.yaml`` in the run folder,
composed as the run composed it; a relative path starts where the studio launched it). A run started
from the command line has no such file: its folder and the sub-folders two levels down that hold
sidecars are its dump folders, named by their path (``dumps/train``).

Token pieces are decoded here with the run's tokenizer (``data.tokenizer``, else the actor's
``tokenizer_path``, else ``model.path``; a dump folder's ``meta.json`` may name it too), loaded once per
folder with ``AutoTokenizer`` and never with the folder's own code; no model is loaded. Like every
route of the studio these need its token, and read nothing outside its folders: a dump folder or a
tokenizer outside them is named in ``notes`` and not read (the embedded model's tokenizer is the
package's own, read once a run has unpacked it).

Routes (GET; a bad run folder, folder, step or uid is a 4xx with one line):
``/api/trajectories?run_dir=`` the dump folders and their steps; ``/api/trajectories/step?run_dir=&folder=&step=``
the step's prompt groups with each response's summary; ``/api/trajectories/group?...&uid=`` the group's
responses with their tokens (:func:`hybrid_rl.studio.trajectory_rows.row_detail`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from hybrid_rl.studio.trajectory_rows import group_rows, read_step, row_detail, row_uid, step_files
from hybrid_rl.studio.workspace import Refused, Workspace

__all__ = ["RunDumps", "TrajectoryError", "add_trajectory_routes", "find_dumps", "group_json", "step_json",
           "steps_json"]

logger = logging.getLogger(__name__)

CONFIG_FILE = "studio_config.yaml"
"""The YAML a run launched from the studio reads, in its run folder (:data:`hybrid_rl.studio.runs.CONFIG_NAME`)."""
META_FILE = "meta.json"
"""A dump folder's record of the run (its ``config``, when present, names the tokenizer)."""
DUMP_KEYS = {"train": "rollout_data_dir", "val": "validation_data_dir"}
"""The dump folders a run's config names: ``{folder name: trainer key}``."""
SCAN_DEPTH = 2
"""How deep below a run folder without a studio config the dump folders are looked for."""


class TrajectoryError(Refused):
    """A request the viewer cannot answer, with its HTTP status and one line."""


@dataclass
class RunDumps:
    """What the viewer found for one run folder."""

    run_dir: Path
    """The run folder, resolved."""
    folders: dict[str, Path] = field(default_factory=dict)
    """``{name: dump folder, resolved}``: ``train`` / ``val`` from the config, else paths under the run."""
    tokenizer: Optional[str] = None
    """The folder (or the embedded model's id) whose tokenizer decodes the tokens; None: ids only."""
    tool_format: str = "hermes"
    """``rollout.multi_turn.format``: how a model turn's tool calls are parsed."""
    notes: list[str] = field(default_factory=list)
    """One line per thing the page should know (a folder outside the studio's folders, no tokenizer)."""


@functools.lru_cache(maxsize=16)
def _composed(config_file: str, mtime_ns: int) -> dict[str, Any]:
    """The run's config, composed from its studio YAML as the run composed it (cached per file version)."""
    from hybrid_rl.studio.form import to_overrides, values_from_yaml
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
    from hybrid_rl.utils.log_setup import recorded_config_notices

    values = values_from_yaml(Path(config_file).read_text(encoding="utf-8"))
    with recorded_config_notices():
        return dataclasses.asdict(to_ppo_config(get_config(to_overrides(values))))


def _config_tokenizer(config: dict[str, Any]) -> tuple[Optional[str], str]:
    """``(tokenizer path, tool-call format)`` as the run chose them (``build_tokenizer``'s order)."""
    model = config.get("actor_rollout_ref", {}).get("model", {})
    path = config.get("data", {}).get("tokenizer") or model.get("tokenizer_path") or model.get("path")
    multi_turn = config.get("actor_rollout_ref", {}).get("rollout", {}).get("multi_turn", {})
    return path, multi_turn.get("format") or "hermes"


def _scanned(run_dir: Path, workspace: Workspace) -> dict[str, Path]:
    """Folders at most :data:`SCAN_DEPTH` below ``run_dir`` (itself included) holding sidecars, by relative path."""
    found, level = {}, [run_dir]
    for _ in range(SCAN_DEPTH + 1):
        for folder in level:
            if workspace.inside(folder.resolve()) and step_files(folder):
                found[str(folder.relative_to(run_dir)) if folder != run_dir else "."] = folder.resolve()
        level = sorted(p for folder in level for p in folder.iterdir()  # a link out of the folders is not listed
                       if p.is_dir() and not p.name.startswith(".") and workspace.inside(p.resolve()))
    return found


def find_dumps(run_dir: Path, workspace: Workspace) -> RunDumps:
    """The dump folders and tokenizer of the run folder ``run_dir`` (resolved, inside ``workspace``)."""
    found = RunDumps(run_dir)
    config_file = run_dir / CONFIG_FILE
    config: dict[str, Any] = {}
    if config_file.is_file() and workspace.inside(config_file.resolve()):
        try:
            config = _composed(str(config_file), config_file.stat().st_mtime_ns)
        except (ValueError, OSError) as error:  # an edited file the CLI refuses: the scan still finds folders
            found.notes.append(f"{config_file} does not compose ({str(error).splitlines()[0][:200]}); "
                               "dump folders were looked for in the run folder instead")
    for name, key in DUMP_KEYS.items():
        value = config.get("trainer", {}).get(key)
        if value:
            refusal = workspace.refusal(value)
            if refusal is None:
                found.folders[name] = workspace.resolve(value)
            else:
                found.notes.append(f"trainer.{key}={refusal}")
    if not config:  # a command-line run: its folders hold the dumps, their meta.json the config
        found.folders = _scanned(run_dir, workspace)
        config = _meta_config(found, workspace)
    if config:
        found.tokenizer, found.tool_format = _config_tokenizer(config)
    return found


def _meta_config(found: RunDumps, workspace: Workspace) -> dict[str, Any]:
    """The ``config`` of the first dump folder's ``meta.json`` that has one, else {}."""
    for folder in found.folders.values():
        meta = folder / META_FILE
        try:
            readable = meta.is_file() and workspace.inside(meta.resolve())
            config = json.loads(meta.read_text(encoding="utf-8")).get("config") if readable else None
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(config, dict):
            return config
    return {}


class Tokenizers:
    """The runs' tokenizers, loaded once per folder (``AutoTokenizer``, never the folder's own code)."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _folder(self, path: str) -> tuple[Optional[Path], Optional[str]]:
        """``(the tokenizer's folder, None)`` or ``(None, why not)``."""
        from hybrid_rl.workers.model_loader import _CONVERTED_NAME, EMBEDDED_MODEL_ID
        from hybrid_rl.utils.cache import cache_root

        if path == EMBEDDED_MODEL_ID:  # the package's own model, once a run has unpacked it (never here)
            folder = cache_root() / "models" / _CONVERTED_NAME
            return (folder, None) if (folder / "tokenizer_config.json").is_file() else (
                None, f"the embedded model {path} is not unpacked yet (a run unpacks it); token ids are shown")
        refusal = self.workspace.refusal(path)
        if refusal is not None:
            return None, f"the tokenizer {refusal}; token ids are shown"
        folder = self.workspace.resolve(path)
        if not folder.is_dir():
            return None, f"the tokenizer folder {folder} does not exist; token ids are shown"
        return folder, None

    def decoder(self, path: Optional[str]) -> tuple[Optional[Callable[[list[int]], str]], Optional[str]]:
        """``(decode(ids) -> text, None)``, or ``(None, the one-line reason)``."""
        if not path:
            return None, "the run's config names no tokenizer (no studio_config.yaml or meta.json); token ids are shown"
        folder, why = self._folder(path)
        if folder is None:
            return None, why
        with self._lock:
            if str(folder) not in self._loaded:
                from transformers import AutoTokenizer

                try:
                    self._loaded[str(folder)] = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
                except (OSError, ValueError) as error:
                    return None, f"the tokenizer of {folder} does not load ({str(error).splitlines()[0][:160]})"
        tokenizer = self._loaded[str(folder)]
        return (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)), None


def _run(run_dir: str, workspace: Workspace) -> RunDumps:
    """The run folder ``run_dir`` names, confined to ``workspace``; TrajectoryError (one line) otherwise."""
    return find_dumps(workspace.run_folder(run_dir), workspace)


def steps_json(run_dir: str, workspace: Workspace) -> dict[str, Any]:
    """``{run_dir, folders: [{name, path, steps, updated}], notes}`` (``updated``: the newest step file's
    modification time, in ns: the page reloads a step still being written when it changes)."""
    found = _run(run_dir, workspace)
    folders = []
    for name, path in found.folders.items():
        files = step_files(path)
        updated = max((p.stat().st_mtime_ns for pair in files.values() for p in pair), default=0)
        folders.append({"name": name, "path": str(path), "steps": list(files), "updated": updated})
    if not folders:
        found.notes.append(f"{found.run_dir} holds no dumps. Fix: run with trainer.rollout_data_dir and/or "
                           "trainer.validation_data_dir set (docs/observability.md)")
    return {"run_dir": str(found.run_dir), "folders": folders, "notes": found.notes}


def _step_rows(found: RunDumps, folder: str, step: str, workspace: Workspace) -> list[dict[str, Any]]:
    """The rows of dump step ``step`` of ``folder``; TrajectoryError (one line) for a bad name or step."""
    if folder not in found.folders:
        names = ", ".join(found.folders) or "none"
        raise TrajectoryError(404, f"folder={folder!r} is not a dump folder of {found.run_dir} (its folders: {names}). "
                                   "Fix: pick one of those")
    files = step_files(found.folders[folder])
    known = ", ".join(str(s) for s in files) or "none yet"
    if not step.strip().isdigit():
        raise TrajectoryError(400, f"step={step!r} is not a step number. Fix: give one of the dumped steps ({known})")
    if int(step) not in files:
        raise TrajectoryError(404, f"step {int(step)} has no dump in {found.folders[folder]} (its steps: {known}). "
                                   "Fix: pick one of those steps")
    paths = files[int(step)]
    if not all(workspace.inside(p.resolve()) for p in paths):  # a link out of the studio's folders
        raise TrajectoryError(403, f"step {int(step)}'s files in {found.folders[folder]} link outside the studio's "
                                   "folders; they are not read. Fix: copy the dump into the run folder")
    return read_step(*paths)


def step_json(run_dir: str, folder: str, step: str, workspace: Workspace) -> dict[str, Any]:
    """``{folder, step, rows, groups}`` of one dumped step (:func:`group_rows`)."""
    rows = _step_rows(_run(run_dir, workspace), folder, step, workspace)
    return {"folder": folder, "step": int(step), "rows": len(rows), "groups": group_rows(rows)}


def group_json(run_dir: str, folder: str, step: str, uid: str, workspace: Workspace, tokenizers: Tokenizers
               ) -> dict[str, Any]:
    """``{folder, step, uid, input, gts, rows: [row_detail], notes}`` of one prompt group."""
    from hybrid_rl.agents.parser import TOOL_CALL_FORMATS

    found = _run(run_dir, workspace)
    rows = [r for r in _step_rows(found, folder, step, workspace) if row_uid(r) == uid]
    if not rows:
        raise TrajectoryError(404, f"uid={uid!r} is not a prompt group of step {int(step)} ({folder}). "
                                   "Fix: pick a uid from the step's groups")
    decode, why = tokenizers.decoder(found.tokenizer)
    parse = TOOL_CALL_FORMATS.get(found.tool_format, TOOL_CALL_FORMATS["hermes"])
    return {"folder": folder, "step": int(step), "uid": uid, "input": rows[0]["verl"].get("input", ""),
            "gts": rows[0]["verl"].get("gts"), "rows": [row_detail(r, decode, parse) for r in rows],
            "notes": [*found.notes, *([why] if why else [])]}


def add_trajectory_routes(app: Any, workspace: Workspace) -> None:
    """Register the viewer's three GET routes on the studio's ``app`` (the token guard covers them)."""
    from fastapi.responses import JSONResponse

    tokenizers = Tokenizers(workspace)

    def answer(compute: Callable[[], dict[str, Any]]) -> Any:
        try:
            return compute()
        except Refused as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)

    @app.get("/api/trajectories")
    def steps(run_dir: str = "") -> Any:
        return answer(lambda: steps_json(run_dir, workspace))

    @app.get("/api/trajectories/step")
    def step(run_dir: str = "", folder: str = "", step: str = "") -> Any:
        return answer(lambda: step_json(run_dir, folder, step, workspace))

    @app.get("/api/trajectories/group")
    def group(run_dir: str = "", folder: str = "", step: str = "", uid: str = "") -> Any:
        return answer(lambda: group_json(run_dir, folder, step, uid, workspace, tokenizers))
