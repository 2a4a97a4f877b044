"""The studio's HTTP side through FastAPI's test client: what the page sends and gets back."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")
from hybrid_rl.studio.form import values_from_yaml  # noqa: E402
from hybrid_rl.studio.server import create_app, parse_text, to_text  # noqa: E402
from hybrid_rl.studio.schema import config_schema  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder the studio may look into (besides the one the tests run in)."""
    return tmp_path_factory.mktemp("studio_server")


@pytest.fixture(scope="module")
def client(local_client, work):
    return local_client(create_app(TOKEN, roots=(str(work),)))


def test_the_page_and_the_schema_are_served(client):
    assert "hybrid_rl studio" in client.get("/").text
    schema = client.get("/api/schema").json()
    assert [f["key"] for f in schema["fields"]] == [f.key for f in config_schema()[0]]
    assert set(schema["beginner"]) <= {f["key"] for f in schema["fields"]}
    assert schema["presets"]["default"] == {}
    assert schema["presets"]["arithmetic_grpo_lora"]["actor_rollout_ref.model.lora_rank"] == "32"


@pytest.mark.parametrize("key, text", [("data.train_batch_size", "abc"), ("data.train_files", "/no/such.parquet"),
                                       ("algorithm.adv_estimator", "nope"), ("trainer.logger", "[console,"), ("data.val_files", "[a,"),
                                       ("actor_rollout_ref.actor.optim.lr", "")])
def test_bad_input_is_one_message_beside_its_field_and_blocks_the_export(client, key, text):
    response = client.post("/api/check", json={"values": {key: text}})
    assert response.status_code == 200
    errors = response.json()["errors"]
    assert list(errors) == [key] and "\n" not in errors[key]
    assert client.post("/api/export", json={"values": {key: text}}).json() == {"errors": errors}


def test_a_valid_form_exports_a_yaml_and_a_command_that_load_back(client):
    texts = {"data.max_response_length": "32", "trainer.logger": "[console, jsonl]",
             "trainer.total_training_steps": "2", "actor_rollout_ref.rollout.enforce_eager": "true"}
    assert client.post("/api/check", json={"values": texts}).json() == {"errors": {}}
    out = client.post("/api/export", json={"values": texts}).json()
    assert out["errors"] == {} and "trainer.total_training_steps=2" in out["command"]
    assert yaml.safe_load(out["yaml"])["data"]["max_response_length"] == 32
    back = client.post("/api/import", json={"text": out["yaml"], "kind": "yaml"}).json()["values"]
    again = client.post("/api/import", json={"text": out["command"], "kind": "command"}).json()["values"]
    assert back == again == {k: v for k, v in texts.items() if k != "trainer.logger"} | {
        "actor_rollout_ref.rollout.enforce_eager": True}  # the logger's value is the default
    assert values_from_yaml(out["yaml"])["trainer.total_training_steps"] == 2


def test_unreadable_imports_are_one_line_and_unknown_keys_are_named(client):
    assert "error" in client.post("/api/import", json={"text": "- a\n- b", "kind": "yaml"}).json()
    assert "error" in client.post("/api/import", json={"text": "x=[1", "kind": "command"}).json()
    errors = client.post("/api/check", json={"values": {"data.nope": "1"}}).json()["errors"]
    assert "data.nope is not a config key" in errors["data.nope"]


@pytest.mark.parametrize("value", [None, True, 3, 1e-06, "text", ["a", "b"], {"k": 1.5}])
def test_a_fields_text_round_trips_to_its_value(value):
    spec = next(f for f in config_schema()[0] if f.kind == "any")
    assert parse_text(spec, to_text(value)) == value


def test_other_hosts_and_cross_site_posts_are_refused(client):
    assert client.get("/api/schema", headers={"host": "evil.example"}).status_code == 403
    cross = client.post("/api/check", json={"values": {}}, headers={"origin": "http://evil.example"})
    assert cross.status_code == 403
    same = client.post("/api/check", json={"values": {}}, headers={"origin": "http://127.0.0.1"})
    assert same.status_code == 200


def test_the_schema_has_labels_and_paths_are_checked(client, work):
    schema = client.get("/api/schema").json()
    field = next(f for f in schema["fields"] if f["key"] == "data.train_batch_size")
    assert field["label"] == "Train batch size" and field["path_role"] is None
    assert all(g["label"] for g in schema["groups"])
    (work / "train.parquet").write_text("x")
    found = client.post("/api/paths", json={"values": {
        "data.train_files": f"[{work}/train.parquet, {work}/no/such.parquet]", "data.val_files": "null",
        "data.train_batch_size": "4", "actor_rollout_ref.model.path": "HuggingFaceTB/SmolLM2-135M-Instruct"}}).json()["paths"]
    assert set(found) == {"data.train_files", "actor_rollout_ref.model.path"}  # unset and non-path keys left out
    assert found["data.train_files"]["state"] == "missing" and f"{work}/no/such.parquet" in found["data.train_files"]["message"]
    assert found["actor_rollout_ref.model.path"]["state"] == "ok"
    assert client.get("/static/form.js").status_code == 200
