"""The studio's HTTP side (FastAPI): the schema, checks, export and import as JSON, and the page.

The page (``static/index.html``) holds no knowledge of the config: it renders whatever ``/api/schema``
returns and shows whatever ``/api/check`` says beside each field. Every value travels as the text
the user typed; :func:`parse_text` turns it into a value by the field's kind, so a non-number in a
number field reaches the CLI's own check and comes back as its one-line message, never as a server
error.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from hybrid_rl.studio.fields import describe_path, human_label
from hybrid_rl.studio.form import (changed_values, check_values, command_line, format_value, parse_command_line,
                                   parse_overrides, to_yaml, values_from_yaml)
from hybrid_rl.studio.presets import load_presets
from hybrid_rl.studio.runs import CHARTS, RunLauncher, read_runs
from hybrid_rl.studio.schema import BEGINNER_KEYS, FieldSpec, config_schema

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


def paths_json(texts: Mapping[str, Any]) -> dict[str, Any]:
    """``{key: {"state", "message"}}`` for the path fields among ``texts`` (whether what each names
    exists; :func:`hybrid_rl.studio.fields.describe_path`); unset or unreadable fields are left out."""
    specs = _specs_by_key()
    out = {}
    for key, text in texts.items():
        spec = specs.get(key)
        if spec is None or spec.path_role is None:
            continue
        try:
            described = describe_path(spec.path_role, parse_text(spec, text))
        except ValueError:
            continue  # the check names unreadable text
        if described is not None:
            out[key] = described
    return out


def checked_values(texts: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, errors)``: the messages of unreadable input, else of the CLI's checks."""
    values, errors = typed_values(texts)
    return values, errors or check_values(values)


def check_json(texts: Mapping[str, Any]) -> dict[str, Any]:
    """``{"errors": {key: message}}``."""
    return {"errors": checked_values(texts)[1]}


def export_json(texts: Mapping[str, Any]) -> dict[str, Any]:
    """The YAML and the command line of valid input; only ``errors`` otherwise (nothing invalid
    can be exported)."""
    values, errors = checked_values(texts)
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


LOCAL_HOSTS = ("127.0.0.1", "localhost", "testserver")
"""Host names the server answers by default (``testserver``: FastAPI's test client)."""


def _same_origin_only(app: Any, hosts: tuple[str, ...]) -> None:
    """Refuse requests addressed to another host name (DNS rebinding) and state-changing requests
    from another page's origin: a web page the user visits must not launch runs (a run may execute
    code: a reward file, ``trust_remote_code``)."""
    from urllib.parse import urlsplit

    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def guard(request: Any, call_next: Any) -> Any:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]")
        origin = request.headers.get("origin")
        if host not in hosts:
            return JSONResponse({"error": f"host {host!r} is not served; open the studio by one of {list(hosts)}"},
                                status_code=403)
        if request.method != "GET" and origin and urlsplit(origin).netloc != request.headers.get("host"):
            return JSONResponse({"error": "requests from another page are refused"}, status_code=403)
        return await call_next(request)


def create_app(hosts: tuple[str, ...] = LOCAL_HOSTS, plugins: tuple[str, ...] = ()) -> Any:
    """The FastAPI application (``hybrid_rl[studio]``), answering requests addressed to ``hosts``;
    ``plugins``: files imported now (their registered names join the choices) and by every run
    launched from the page."""
    from hybrid_rl.studio.plugins import load_plugin_files

    load_plugin_files(list(plugins))
    from fastapi import Body, FastAPI
    from fastapi.responses import FileResponse

    app = FastAPI(title="hybrid_rl studio")
    _same_origin_only(app, hosts)
    launcher = RunLauncher(plugins=plugins)

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")  # the page's scripts
    app.get("/api/schema")(schema_json)

    @app.post("/api/check")
    def check(values: dict = Body(..., embed=True)) -> dict:
        return check_json(values)

    @app.post("/api/paths")
    def paths(values: dict = Body(..., embed=True)) -> dict:
        return paths_json(values)

    @app.post("/api/export")
    def export(values: dict = Body(..., embed=True)) -> dict:
        return export_json(values)

    @app.post("/api/import")
    def load(text: str = Body(..., embed=True), kind: str = Body("yaml", embed=True)) -> dict:
        return import_json(text, kind)

    _add_run_routes(app, launcher)
    app.router.on_shutdown.append(launcher.stop_all)
    return app


def _add_run_routes(app: Any, launcher: RunLauncher) -> None:
    """Launch, follow and stop runs from the page; watch any run folder."""
    from fastapi import Body

    @app.post("/api/runs")
    def launch(values: dict = Body(..., embed=True)) -> dict:
        typed, errors = checked_values(values)
        if errors:
            return {"errors": errors}
        try:
            run_id = launcher.launch(changed_values(typed))
        except ValueError as error:  # the folder is in use by a run still going
            return {"errors": {"trainer.default_local_dir": str(error)}}
        return {"errors": {}, "id": run_id, "run_dir": str(launcher.get(run_id).run_dir)}

    @app.get("/api/runs/{run_id}")
    def run_state(run_id: int) -> dict:
        try:
            return launcher.get(run_id).state()
        except KeyError as error:
            return {"error": str(error.args[0])}

    @app.post("/api/runs/{run_id}/stop")
    def stop(run_id: int) -> dict:
        try:
            launcher.get(run_id).stop()
        except KeyError as error:
            return {"error": str(error.args[0])}
        return {"stopping": True}

    @app.get("/api/watch")
    def watch(run_dir: str) -> dict:
        if not os.path.isdir(os.path.expanduser(run_dir)):
            return {"error": f"{run_dir} is not a folder; give a run's trainer.default_local_dir"}
        return read_runs(run_dir)
