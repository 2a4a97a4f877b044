"""The studio's HTTP side (FastAPI): the schema, checks, export and import as JSON, and the page.

The page (``static/index.html``) holds no knowledge of the config: it renders whatever ``/api/schema``
returns and shows whatever ``/api/check`` says beside each field. Every value travels as the text
the user typed; :func:`parse_text` turns it into a value by the field's kind, so a non-number in a
number field reaches the CLI's own check and comes back as its one-line message, never as a server
error.

Every route but the page needs the studio's token (:mod:`hybrid_rl.studio.access`); paths are
answered, watched and run only inside the studio's folders, and a launch that executes code names
it first and starts only once the request repeats those paths (:mod:`hybrid_rl.studio.workspace`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

from hybrid_rl.studio.fields import describe_path, human_label
from hybrid_rl.studio.form import (changed_values, check_values, command_line, format_value, parse_command_line,
                                   parse_overrides, to_yaml, values_from_yaml)
from hybrid_rl.studio.presets import load_presets
from hybrid_rl.studio.access import Access, add_guard, add_page, new_token
from hybrid_rl.studio.runs import CHARTS, LaunchPlan, RunLauncher, read_runs
from hybrid_rl.studio.schema import BEGINNER_KEYS, FieldSpec, config_schema
from hybrid_rl.studio.timeline import add_timeline_routes
from hybrid_rl.studio.trajectories import add_trajectory_routes
from hybrid_rl.studio.workspace import Refused, Workspace, _leaves as _tree_leaves, code_paths, path_refusals

STATIC_DIR = Path(__file__).with_name("static")


def parse_text(spec: FieldSpec, text: Any) -> Any:
    """The value of a field's text, read as the command line reads ``key=<text>`` (Hydra's grammar:
    ``null``, ``1e-06``, ``[a, b]``, ``{k: 1}``); a string field takes its text as it is. A number
    that does not parse stays text, for the CLI's type check to name."""
    if not isinstance(text, str):  # a checkbox sends true / false
        return text
    if spec.kind == "str" and not (spec.optional and text.strip() == "null"):
        return text
    try:
        return parse_overrides([f"value={text}"])["value"]
    except ValueError:
        if spec.kind in ("int", "float", "bool"):
            return text
        raise ValueError(f"{spec.key}: cannot read {text!r}. Fix: write e.g. [a, b] for a list, {{key: 1}} for "
                         "a mapping, or quote the text") from None


def to_text(value: Any) -> Any:
    """A value as the page's field shows it (the inverse of :func:`parse_text`); bools stay bools."""
    return value if isinstance(value, (bool, str)) else format_value(value)


def _specs_by_key() -> dict[str, FieldSpec]:
    """Each config field's spec by its dotted key, from :func:`config_schema`."""
    return {f.key: f for f in config_schema()[0]}


def typed_values(texts: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, errors)`` of the page's texts: unknown keys and unreadable list or mapping text are errors."""
    specs = _specs_by_key()
    values, errors = {}, {}
    for key, text in texts.items():
        if key not in specs:
            errors[key] = f"{key} is not a config key; reload the page"
            continue
        try:
            values[key] = parse_text(specs[key], text)
        except ValueError as error:
            errors[key] = str(error)
    return values, errors


def schema_json() -> dict[str, Any]:
    """What the page renders: fields, sections, the beginner view's keys and the recipes' presets."""
    fields, groups = config_schema()
    return {
        "fields": [{**dataclasses.asdict(f), "group": f.group, "label": f.label, "path_role": f.path_role,
                    "default": to_text(f.default)} for f in fields],
        "groups": [{**dataclasses.asdict(g), "label": human_label(g.key)} for g in groups],
        "beginner": list(BEGINNER_KEYS),
        "charts": [{"title": title, "y_label": y_label, "keys": list(keys)} for title, y_label, keys in CHARTS],
        "presets": {name: {k: to_text(v) for k, v in values.items()} for name, values in load_presets().items()},
    }


def paths_json(texts: Mapping[str, Any], workspace: Optional[Workspace] = None) -> dict[str, Any]:
    """``{key: {"state", "message"}}`` for the path fields among ``texts`` (whether what each names
    exists; :func:`hybrid_rl.studio.fields.describe_path`); unset or unreadable fields are left out.
    With a ``workspace``, a path outside it is ``refused`` unless it is the field's default."""
    specs = _specs_by_key()
    out = {}
    for key, text in texts.items():
        spec = specs.get(key)
        if spec is None or spec.path_role is None:
            continue
        try:
            value = parse_text(spec, text)
        except ValueError:
            continue  # the check names unreadable text
        described = describe_path(spec.path_role, value, None if value == spec.default else workspace)
        if described is not None:
            out[key] = described
    return out


@functools.lru_cache(maxsize=1)
def _default_leaves() -> dict[str, Any]:
    """The composed defaults as ``{dotted key: value}`` (interpolations resolved)."""
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
    from hybrid_rl.utils.log_setup import recorded_config_notices

    with recorded_config_notices():
        return dict(_tree_leaves(dataclasses.asdict(to_ppo_config(get_config([])))))


def _confiner(workspace: Optional[Workspace]) -> Optional[Callable[[Any], dict[str, str]]]:
    """What :func:`check_values` asks before any check looks at the disk: the composed config's paths
    outside ``workspace`` (:func:`path_refusals`), so no check answers whether a path out there exists."""
    if workspace is None:
        return None
    fields = [key for key, spec in _specs_by_key().items() if spec.path_role is not None]
    return lambda config: path_refusals(dataclasses.asdict(config), _default_leaves(), fields, workspace)


def checked_values(texts: Mapping[str, Any], workspace: Optional[Workspace] = None,
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, errors)``: the messages of unreadable input, else of paths outside ``workspace`` (when
    given), else of the CLI's checks."""
    values, errors, _ = _checked(texts, workspace)
    return values, errors


def _checked(texts: Mapping[str, Any], workspace: Optional[Workspace]) -> tuple[dict[str, Any], dict[str, str], int]:
    """:func:`checked_values` with the HTTP status its errors deserve: 403 for paths outside ``workspace``,
    else 400."""
    values, errors = typed_values(texts)
    if errors:
        return values, errors, 400
    confine, refused = _confiner(workspace), {}

    def recorded(config: Any) -> dict[str, str]:
        refused.update(confine(config))
        return refused

    errors = check_values(values, recorded if confine is not None else None)
    return values, errors, 403 if refused else 400


def check_json(texts: Mapping[str, Any], workspace: Optional[Workspace] = None) -> dict[str, Any]:
    """``{"errors": {key: message}}``."""
    return {"errors": checked_values(texts, workspace)[1]}


def export_json(texts: Mapping[str, Any], workspace: Optional[Workspace] = None) -> dict[str, Any]:
    """The YAML and the command line of valid input; only ``errors`` otherwise (nothing invalid
    can be exported)."""
    values, errors = checked_values(texts, workspace)
    if errors:
        return {"errors": errors}
    changed = changed_values(values)
    return {"errors": {}, "yaml": to_yaml(changed), "command": command_line(changed)}


def import_json(text: str, kind: str) -> dict[str, Any]:
    """The page's texts of a YAML file or a command line: ``{"values": ...}`` or ``{"error": line}``."""
    try:
        values = values_from_yaml(text) if kind == "yaml" else parse_command_line(text)
    except (ValueError, yaml.YAMLError) as error:  # noqa: B014 (YAMLError is no ValueError)
        return {"error": str(error).splitlines()[0]}
    return {"values": {k: to_text(v) for k, v in values.items()}}


def create_app(token: Optional[str] = None, bind_host: str = "127.0.0.1", allow_remote: bool = False,
               roots: tuple[str, ...] = (), plugins: tuple[str, ...] = (), port: Optional[int] = None) -> Any:
    """The FastAPI application (``hybrid_rl[studio]``).

    ``token``: what every request but the page needs (None: a random one; ``app.state.token`` holds
    it); ``bind_host``: the address the server will bind, loopback unless ``allow_remote``
    (:class:`hybrid_rl.studio.access.Access`); ``roots``: folders the studio may read and run code
    from besides the working folder (:class:`Workspace`); ``plugins``: files imported now (their
    registered names join the choices) and by every run launched from the page; ``port``: names the
    token cookie, so two studios on one machine keep their own. ValueError (one line) on a bad token
    or a non-loopback ``bind_host`` without ``allow_remote``."""
    from hybrid_rl.studio.plugins import load_plugin_files

    cookie = "hybrid_rl_studio_token" + (f"_{port}" if port else "")
    access = Access(token=token or new_token(), bind_host=bind_host, allow_remote=allow_remote, cookie=cookie)
    load_plugin_files(list(plugins))
    from fastapi import Body, FastAPI

    # no /docs, /redoc, /openapi.json: the page is the studio's client (and /docs would load a CDN's scripts)
    app = FastAPI(title="hybrid_rl studio", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.token = access.token
    workspace = Workspace([os.getcwd(), *roots])
    app.state.workspace = workspace
    add_guard(app, access)
    add_page(app, access, STATIC_DIR / "index.html")
    launcher = RunLauncher(cwd=str(workspace.base), plugins=plugins)

    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")  # the page's scripts
    app.get("/api/schema")(schema_json)

    @app.post("/api/check")
    def check(values: dict = Body(..., embed=True)) -> dict:
        return check_json(values, workspace)

    @app.post("/api/paths")
    def paths(values: dict = Body(..., embed=True)) -> Any:
        found = paths_json(values, workspace)
        refused = [f"{key}: {p['message']}" for key, p in found.items() if p["state"] == "refused"]
        if refused:  # the fields' states come back too, for the page to show beside each field
            return _error(403, refused[0], paths=found)
        return {"paths": found}

    @app.post("/api/export")
    def export(values: dict = Body(..., embed=True)) -> dict:
        return export_json(values, workspace)

    @app.post("/api/import")
    def load(text: str = Body(..., embed=True), kind: str = Body("yaml", embed=True)) -> dict:
        return import_json(text, kind)

    _add_run_routes(app, launcher, workspace)
    add_timeline_routes(app, workspace)  # a run's step timeline (hybrid_rl/studio/timeline.py)
    add_trajectory_routes(app, workspace)  # the trajectory viewer (hybrid_rl/studio/trajectories.py)
    app.router.on_shutdown.append(launcher.stop_all)
    return app


def _error(status: int, message: str, **extra: Any) -> Any:
    """A JSON answer ``{"error": message, **extra}`` with an HTTP error status."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message, **extra}, status_code=status)


def _code_check(plan: LaunchPlan, workspace: Workspace, confirmed: list) -> Optional[Any]:
    """The answer that stops a launch for its code paths, or None: 403 when one lies outside the
    workspace, 409 with ``confirm`` (the paths, for the user to see) until the request repeats
    exactly those paths as ``confirm_code``."""
    found = code_paths(plan.config, workspace)
    for code in found:
        refusal = workspace.refusal(code.path)
        if refusal is not None:
            return _error(403, f"{code.key}={refusal}", errors={code.key: f"{code.key}={refusal}"})
    if found and sorted(c.path for c in found) != sorted(str(c) for c in confirmed):
        return _error(409, "this run executes the code listed in confirm; launch again with confirm_code set to "
                           "those paths once you have checked them", errors={},
                      confirm=[dataclasses.asdict(c) for c in found])
    return None


def _add_run_routes(app: Any, launcher: RunLauncher, workspace: Workspace) -> None:
    """Launch (after its code paths are confirmed), follow and stop runs; watch a run folder of the workspace."""
    from fastapi import Body

    @app.post("/api/runs")
    def launch(values: dict = Body(..., embed=True), confirm_code: list = Body([], embed=True)) -> Any:
        typed, errors, status = _checked(values, workspace)
        if errors:
            return _error(status, next(iter(errors.values())), errors=errors)
        changed = changed_values(typed)
        try:
            plan = launcher.plan(changed)
            refusal = workspace.refusal(str(plan.run_dir))  # resolved: a link out of the folders is outside
            if refusal is not None:
                message = f"trainer.default_local_dir={refusal}"
                return _error(403, message, errors={"trainer.default_local_dir": message})
            stop = _code_check(plan, workspace, confirm_code)
            if stop is not None:
                return stop
            run_id = launcher.launch(plan, changed)
        except ValueError as error:  # a file for a folder; the folder in use by a run still going
            return _error(400, str(error), errors={"trainer.default_local_dir": str(error)})
        return {"errors": {}, "id": run_id, "run_dir": str(plan.run_dir)}

    @app.get("/api/runs/{run_id}")
    def run_state(run_id: int) -> Any:
        try:
            return launcher.get(run_id).state(workspace.inside)
        except KeyError as error:
            return _error(404, str(error.args[0]))

    @app.post("/api/runs/{run_id}/stop")
    def stop(run_id: int) -> Any:
        try:
            launcher.get(run_id).stop()
        except KeyError as error:
            return _error(404, str(error.args[0]))
        return {"stopping": True}

    @app.get("/api/watch")
    def watch(run_dir: str) -> Any:
        try:
            folder = workspace.run_folder(run_dir)
        except Refused as refused:
            return _error(refused.status, str(refused))
        return read_runs(str(folder), workspace.inside)
