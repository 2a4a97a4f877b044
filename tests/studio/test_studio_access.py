"""Who may use the studio (issue 59): the token on every route, the bind address, the peer, the
workspace's paths, the code a launch runs, and no 500 for bad input. One real start at the end."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")
from starlette.routing import Mount  # noqa: E402

from hybrid_rl.studio import runs  # noqa: E402
from hybrid_rl.studio.access import Access, is_loopback  # noqa: E402
from hybrid_rl.studio.server import create_app  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402

FORGED = "forged-token-0123456789abcdef"
PUBLIC = {"/", "/static"}
"""The page and its scripts: the only paths answered without the token."""


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The studio's working folder (the tests' cwd while the app is built)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _requests(app):
    """``(method, path)`` of every route of ``app``, path parameters filled with 1: enumerated, so a
    route added later is covered without naming it here."""
    found = []
    for route in app.routes:
        if isinstance(route, Mount):
            found.append(("GET", route.path + "/app.js"))
            continue
        path = re.sub(r"\{[^}]+\}", "1", route.path)
        found += [(method, path) for method in sorted(route.methods) if method != "HEAD"]
    return found


def _body(method):
    return {"json": {"values": {}}} if method == "POST" else {}


def test_every_route_but_the_page_refuses_a_request_without_the_right_token(work, local_client):
    app = create_app(TOKEN)
    routes = _requests(app)
    assert {p for _, p in routes} >= {"/api/schema", "/api/check", "/api/paths", "/api/runs", "/api/watch"}
    assert {r.path for r in app.routes if isinstance(r, Mount)} <= PUBLIC
    tokenless = local_client(app, token=None)
    for method, path in routes:
        if path in PUBLIC or path.startswith("/static/"):
            continue
        for headers in ({}, {"X-Studio-Token": FORGED}, {"Authorization": f"token {FORGED}"},
                        {"Authorization": f"token {TOKEN[:-1]}"}, {"Cookie": f"hybrid_rl_studio_token={FORGED}"}):
            response = tokenless.request(method, path, headers=headers, **_body(method))
            assert response.status_code == 401, (method, path, headers, response.text)
            assert "needs the studio's token" in response.json()["error"]
    assert tokenless.get("/").status_code == 200 and tokenless.get("/static/app.js").status_code == 200
    for headers in ({"X-Studio-Token": TOKEN}, {"Authorization": f"token {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}"}):
        assert tokenless.get("/api/schema", headers=headers).status_code == 200


def test_openapi_and_unknown_paths_are_no_500(work, local_client):
    client = local_client(create_app(TOKEN))
    for path in ("/openapi.json", "/docs", "/redoc", "/api/nope"):
        assert client.get(path).status_code == 404
        assert local_client(create_app(TOKEN), token=None).get(path).status_code == 401


def test_the_token_url_sets_a_strict_http_only_cookie_the_pages_requests_carry(work, local_client):
    browser = local_client(create_app(TOKEN, port=8123), token=None)
    assert browser.get("/?token=" + FORGED, follow_redirects=False).status_code == 401
    opened = browser.get("/?token=" + TOKEN, follow_redirects=False)
    assert opened.status_code == 303 and opened.headers["location"] == "/"  # the token leaves the address bar
    cookie = opened.headers["set-cookie"]
    assert cookie.startswith(f"hybrid_rl_studio_token_8123={TOKEN};") and "HttpOnly" in cookie
    assert "samesite=strict" in cookie.lower()
    assert browser.get("/api/schema").status_code == 200  # the client kept the cookie, as a browser does


def test_a_forged_host_from_another_machine_is_refused_on_a_remote_bind(work, local_client):
    app = create_app(TOKEN, bind_host="0.0.0.0", allow_remote=True)
    for token in (None, FORGED):
        remote = local_client(app, token=token, peer="203.0.113.7")
        for method, path in _requests(app):
            if path not in PUBLIC and not path.startswith("/static/"):
                response = remote.request(method, path, headers={"Host": "localhost"}, **_body(method))
                assert response.status_code == 401, (method, path)
    remote = local_client(app, peer="203.0.113.7", base_url="http://studio.lan:8080")
    assert remote.get("/api/schema").status_code == 200  # the token, from any host name, is what counts


def test_a_loopback_bind_serves_loopback_peers_and_names_only(work, local_client):
    app = create_app(TOKEN)
    forged = local_client(app, peer="203.0.113.7")  # cannot happen on a loopback socket; refused anyway
    assert forged.get("/api/schema", headers={"Host": "localhost"}).status_code == 403
    rebinding = local_client(app, base_url="http://attacker.example")  # a loopback peer, another site's name
    assert rebinding.get("/api/schema").status_code == 403
    for base in ("http://localhost:8080", "http://127.0.0.1:8080", "http://[::1]:8080"):
        assert local_client(app, base_url=base).get("/api/schema").status_code == 200
    cross = local_client(app).post("/api/check", json={"values": {}}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("no-such-host.invalid", False)])
def test_the_loopback_decision_is_the_bind_addresss(host, loopback):
    assert is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(ValueError, match="is not a loopback address.*--allow-remote"):
            Access(token=TOKEN, bind_host=host)
        assert Access(token=TOKEN, bind_host=host, allow_remote=True).local is False


@pytest.mark.parametrize("token", ["", "short", "x" * 15, "a token with spaces!!", "tökentökentökentöken"])
def test_a_weak_fixed_token_is_refused(token):
    with pytest.raises(ValueError, match="at least 16 ASCII characters"):
        Access(token=token)


def test_paths_outside_the_working_folder_are_refused_and_never_looked_at(work, local_client, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.jsonl").write_text("{}\n")
    (work / "data").mkdir()
    (work / "data" / "train.jsonl").write_text("{}\n")
    (work / "data" / "link").symlink_to(outside)  # a link out of the workspace
    client = local_client(create_app(TOKEN))
    ok = client.post("/api/paths", json={"values": {"data.train_files": "data/train.jsonl"}})
    assert ok.status_code == 200 and ok.json()["paths"]["data.train_files"]["state"] == "ok"
    for text in ("/etc/shadow", f"{outside}/secret.jsonl", f"{outside}/nope", "../../etc/passwd",
                 "data/../../x", "data/link/secret.jsonl", "'~/.ssh/id_rsa'", "/etc/*", "data/*/../../../x"):
        response = client.post("/api/paths", json={"values": {"data.train_files": text}})
        assert response.status_code == 403, text
        field = response.json()["paths"]["data.train_files"]
        assert field["state"] == "refused" and field["message"] in response.json()["error"]
        assert "a file" not in field["message"] and "does not exist" not in field["message"]  # no oracle
    glob = client.post("/api/paths", json={"values": {"data.train_files": "data/*/secret.jsonl"}})
    assert glob.json()["paths"]["data.train_files"]["state"] == "missing"  # a match through the link is none
    default = client.post("/api/paths", json={"values": {"data.arithmetic.cache_dir": "~/.cache/hybrid_rl/arithmetic"}})
    assert default.status_code == 200  # a field's own default is the package's path, always answered


def test_watch_answers_inside_the_workspace_only(work, local_client, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside_run")
    (outside / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5}\n')
    (work / "run").mkdir()
    (work / "run" / "studio_console.log").symlink_to(outside / "metrics.jsonl")  # no reading through a link
    (work / "a_file").write_text("x")
    client = local_client(create_app(TOKEN))
    for run_dir in (str(outside), "/etc", "..", f"{work}/../{outside.name}", "~"):
        response = client.get("/api/watch", params={"run_dir": run_dir})
        assert response.status_code == 403 and "outside the studio's folders" in response.json()["error"], run_dir
    assert client.get("/api/watch", params={"run_dir": "run"}).json()["console"] == []
    file = client.get("/api/watch", params={"run_dir": "a_file"})
    assert file.status_code == 400 and "is not a folder" in file.json()["error"]
    assert client.get("/api/watch", params={"run_dir": "bad\x00"}).status_code == 400
    roots = local_client(create_app(TOKEN, roots=(str(outside),)))  # --root opens another folder
    assert roots.get("/api/watch", params={"run_dir": str(outside)}).json()["metrics"][0]["critic/score/mean"] == 0.5


@pytest.fixture
def started(monkeypatch):
    """Launches recorded instead of started: ``[(run_dir, values)]``."""
    calls = []
    monkeypatch.setattr(runs.RunLauncher, "_start", lambda self, run_dir, values: calls.append((run_dir, values)) or 1)
    return calls


def test_a_launch_that_runs_code_is_shown_first_and_needs_its_paths_confirmed(work, local_client, started):
    (work / "reward.py").write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    client = local_client(create_app(TOKEN))
    values = {"custom_reward_function.path": "reward.py"}
    asked = client.post("/api/runs", json={"values": values})
    assert asked.status_code == 409 and started == []
    assert asked.json()["confirm"] == [{"key": "custom_reward_function.path", "path": str(work / "reward.py"),
                                        "what": "a Python file the run imports (its reward function)"}]
    wrong = client.post("/api/runs", json={"values": values, "confirm_code": ["/tmp/other.py"]})
    assert wrong.status_code == 409 and started == []
    done = client.post("/api/runs", json={"values": values, "confirm_code": [str(work / "reward.py")]})
    assert done.status_code == 200 and done.json()["id"] == 1 and len(started) == 1
    plain = client.post("/api/runs", json={"values": {"trainer.experiment_name": "plain"}})  # no code: no question
    assert plain.status_code == 200 and len(started) == 2
    extra = client.post("/api/runs", json={"values": {"trainer.experiment_name": "extra"}, "confirm_code": ["x.py"]})
    assert extra.status_code == 200 and len(started) == 3  # confirming code a run does not have changes nothing


def test_code_outside_the_working_folder_is_refused(work, local_client, started, tmp_path_factory):
    outside = tmp_path_factory.mktemp("evil")
    (outside / "evil.py").write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    (outside / "tools.yaml").write_text("tools: []\n")
    (work / "link.py").symlink_to(outside / "evil.py")
    client = local_client(create_app(TOKEN))
    for values in ({"custom_reward_function.path": str(outside / "evil.py")},
                   {"custom_reward_function.path": "link.py"},
                   {"actor_rollout_ref.rollout.multi_turn.enable": True,
                    "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(outside / "tools.yaml")}):
        key = next(k for k in values if k.endswith("path"))
        for confirm in ([], [str((outside / "evil.py"))], [str(outside / "tools.yaml")]):
            response = client.post("/api/runs", json={"values": values, "confirm_code": confirm})
            assert response.status_code == 403, values
            assert "outside the studio's folders" in response.json()["errors"][key]
    assert started == []


def test_bad_launches_are_4xx_with_one_line(work, local_client, started, monkeypatch):
    (work / "taken").write_text("a file where the run folder goes")
    client = local_client(create_app(TOKEN))
    response = client.post("/api/runs", json={"values": {"trainer.default_local_dir": "taken"}})
    assert response.status_code == 400 and "trainer.default_local_dir" in response.json()["errors"]
    assert "\n" not in response.json()["error"] and started == []
    for body in ({"values": [1]}, {"values": {}, "confirm_code": "x"}, {}):
        assert 400 <= client.post("/api/runs", json=body).status_code < 500
    assert client.get("/api/runs/x").status_code == 422

    def broken(texts, workspace=None):
        raise RuntimeError("something nobody foresaw\nsecond line")

    monkeypatch.setattr("hybrid_rl.studio.server.check_json", broken)
    failed = client.post("/api/check", json={"values": {}})  # a failure inside a route: 400, one line
    assert failed.status_code == 400
    assert failed.json()["error"] == "the studio could not handle this request: RuntimeError: something nobody foresaw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _studio(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    env.pop("HYBRID_RL_STUDIO_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "hybrid_rl.studio", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_non_loopback_host_or_a_weak_token_ends_the_command_in_one_line(tmp_path):
    for args, words in ((["--host", "0.0.0.0"], "is not a loopback address"), (["--token", "short"], "at least 16"),
                        (["--root", "nope"], "is not a folder")):
        process = _studio(tmp_path, *args)
        output = process.communicate(timeout=300)[0]
        assert process.returncode == 2, output
        assert output.strip().count("\n") == 0 and output.startswith("hybrid_rl studio: ") and words in output


def _get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_a_real_start_prints_its_token_url_and_the_api_refuses_without_it(tmp_path):
    port = _free_port()
    process = _studio(tmp_path, "--port", str(port))
    try:
        deadline, line = time.monotonic() + 300, ""
        while "?token=" not in line and time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline()
        found = re.search(rf"http://127\.0\.0\.1:{port}/\?token=(\S+)", line)
        assert found, line
        token, base = found.group(1), f"http://127.0.0.1:{port}"
        assert len(token) >= 40 and str(tmp_path) in line  # 32 random bytes; the folder it serves
        for _ in range(100):  # the URL is logged just before uvicorn listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        assert _get(base + "/api/schema")[0] == 401
        assert _get(base + "/api/schema", {"Host": "localhost", "X-Studio-Token": FORGED})[0] == 401
        assert _get(base + "/api/schema", {"X-Studio-Token": token})[0] == 200
        assert _get(base + "/api/schema", {"Host": "evil.example", "X-Studio-Token": token})[0] == 403
        opener = urllib.request.build_opener(_NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as redirect:  # the redirect, not followed
            opener.open(f"{base}/?token={token}", timeout=60)
        assert redirect.value.code == 303
        assert f"hybrid_rl_studio_token_{port}={token}" in redirect.value.headers["Set-Cookie"]
        cookie = {"Cookie": f"hybrid_rl_studio_token_{port}={token}"}
        assert _get(base + "/api/schema", cookie)[0] == 200
        assert _get(base + "/openapi.json", {"X-Studio-Token": token})[0] == 404
    finally:
        process.terminate()
        process.wait(timeout=60)
