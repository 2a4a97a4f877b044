"""The studio's step-timeline route: a run's ``timeline.jsonl`` for the page's Gantt chart (``static/timeline.js``).

``GET /api/timeline?run_dir=DIR[&first=A&last=B]`` answers the spans of training steps ``A..B`` (default:
the last :data:`DEFAULT_STEPS` steps, following a run that is going) of the run in ``DIR``, or of the first
run below ``DIR`` that has a timeline (a folder of runs, as ``/api/watch`` overlays them). The file and its
format: :mod:`hybrid_rl.trainer.core.timeline`. Like the run-watching routes, it needs the studio's token and
reads only inside the studio's folders (a ``timeline.jsonl`` that links out of them is not read). Each
file is read incrementally: a poll parses only the lines appended since the last one.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from hybrid_rl.studio.runs import Inside, _readable
from hybrid_rl.studio.workspace import Refused, Workspace
from hybrid_rl.trainer.core.timeline import TIMELINE_FILE

__all__ = ["DEFAULT_STEPS", "MAX_SPANS", "add_timeline_routes", "read_timeline"]

DEFAULT_STEPS = 8
"""Steps shown when the request names none: the last ones."""
MAX_SPANS = 20000
"""Spans one answer carries at most (the first ones of the range; the answer says when it cut)."""
_SPAN_KEYS = ("step", "worker", "name", "start", "end")


class _SpanFile:
    """The spans parsed so far from one ``timeline.jsonl`` and where its next line starts."""

    def __init__(self, identity: tuple[int, int]):
        self.identity = identity  # (device, inode): a new file (a run started over) is read from its start
        self.offset = 0
        self.spans: list[dict[str, Any]] = []

    def read_more(self, path: Path) -> None:
        with open(path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line being written is read once it is complete
        for line in data[:end].splitlines():
            span = _parse(line)
            if span is not None:
                self.spans.append(span)
        self.offset += end


def _parse(line: bytes) -> Optional[dict[str, Any]]:
    """A span of one line, or None when the line is no span (not JSON, a key missing or of the wrong type)."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(row, dict) or any(key not in row for key in _SPAN_KEYS):
        return None
    numbers = [row["step"], row["start"], row["end"]]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        return None
    if not (isinstance(row["worker"], str) and isinstance(row["name"], str)):
        return None
    return row


_files: "OrderedDict[str, _SpanFile]" = OrderedDict()
_files_lock = threading.Lock()
_MAX_FILES = 8


def _spans_of(path: Path) -> list[dict[str, Any]]:
    """Every span of ``path`` (the file's new lines parsed now, the older ones remembered)."""
    stat = path.stat()
    key, identity = str(path), (stat.st_dev, stat.st_ino)
    with _files_lock:
        known = _files.get(key)
        if known is None or known.identity != identity or stat.st_size < known.offset:
            known = _files[key] = _SpanFile(identity)
        _files.move_to_end(key)
        while len(_files) > _MAX_FILES:
            _files.popitem(last=False)
        known.read_more(path)
        return list(known.spans)


def _timeline_path(folder: Path, inside: Inside) -> Optional[Path]:
    """The run's ``timeline.jsonl``, or the first sub-folder's (a folder of runs); None when there is none."""
    own = folder / TIMELINE_FILE
    if _readable(own, inside):
        return own
    return next((p for p in sorted(folder.glob(f"*/{TIMELINE_FILE}")) if _readable(p, inside)), None)


def read_timeline(run_dir: str, first: Optional[int] = None, last: Optional[int] = None,
                  inside: Inside = None) -> dict[str, Any]:
    """``{"run_dir", "run", "spans", "lanes", "names", "steps", "first", "last", "max_step", "message"}``
    (``run``: the sub-folder shown when ``run_dir`` is a folder of runs, else None):
    the spans whose ``step`` is in ``first..last`` (default the last :data:`DEFAULT_STEPS`), the lanes and
    the span names in order of first appearance (``trainer`` first), each shown step's ``[start, end]``
    (its ``step`` span; a step still going ends at its latest span) and ``max_step`` (the latest step)."""
    folder = Path(run_dir).expanduser()
    path = _timeline_path(folder, inside)
    if path is None:
        return {"run_dir": str(folder.resolve()), "run": None, "spans": [], "lanes": [], "names": [], "steps": [],
                "first": None, "last": None, "max_step": None,
                "message": f"no {TIMELINE_FILE} in {folder} yet: a run writes it with the jsonl logger "
                           "(trainer.logger includes jsonl, the default)"}
    spans = _spans_of(path)
    max_step = max((int(s["step"]) for s in spans), default=0)
    last = max_step if last is None else last
    first = max(0, last - DEFAULT_STEPS + 1) if first is None else first
    shown = [s for s in spans if first <= s["step"] <= last]
    message = ""
    if len(shown) > MAX_SPANS:
        message = f"{len(shown)} spans in steps {first}..{last}: the first {MAX_SPANS} are shown; choose fewer steps"
        shown = shown[:MAX_SPANS]
    lanes = list(dict.fromkeys(["trainer"] + [s["worker"] for s in shown]))
    if not any(s["worker"] == "trainer" for s in shown):
        lanes.remove("trainer")
    run = None if path.parent == folder else path.parent.name  # a folder of runs: which one is shown
    return {"run_dir": str(folder.resolve()), "run": run, "spans": shown, "lanes": lanes,
            "names": list(dict.fromkeys(s["name"] for s in shown)), "steps": _step_bounds(shown),
            "first": first, "last": last, "max_step": max_step, "message": message}


def _step_bounds(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{step, start, end}]`` of each step of the trainer's lane: its ``step`` span, or while it runs
    (no ``step`` span yet) its named steps' extent."""
    bounds: dict[int, dict[str, Any]] = {}
    for s in spans:
        if s["worker"] != "trainer":
            continue
        b = bounds.setdefault(int(s["step"]), {"step": int(s["step"]), "start": s["start"], "end": s["end"],
                                               "done": False})
        if s["name"] == "step":
            b.update(start=s["start"], end=s["end"], done=True)
        elif not b["done"]:
            b.update(start=min(b["start"], s["start"]), end=max(b["end"], s["end"]))
    return [bounds[k] for k in sorted(bounds)]


def _step_number(key: str, text: Optional[str]) -> Optional[int]:
    """``text`` as a step number (None when absent); ValueError (one line) when it is none."""
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{key}={text!r} is not a step number. Fix: give a whole number >= 0, or leave {key} out")
    return value


def add_timeline_routes(app: Any, workspace: Workspace) -> None:
    """``GET /api/timeline``: a run folder's spans (:func:`read_timeline`), inside ``workspace`` only."""
    from fastapi.responses import JSONResponse

    def error(status: int, message: str) -> Any:
        return JSONResponse({"error": message}, status_code=status)

    @app.get("/api/timeline")
    def timeline(run_dir: str, first: Optional[str] = None, last: Optional[str] = None) -> Any:
        try:
            folder = workspace.run_folder(run_dir)
        except Refused as refused:
            return error(refused.status, str(refused))
        try:
            first_step, last_step = _step_number("first", first), _step_number("last", last)
        except ValueError as bad:
            return error(400, str(bad))
        if first_step is not None and last_step is not None and first_step > last_step:
            return error(400, f"first={first_step} is after last={last_step}. Fix: give first <= last")
        return read_timeline(str(folder), first_step, last_step, workspace.inside)
