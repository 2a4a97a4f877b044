"""The studio's labels and path fields: derived from the key, and what a path's text names on disk."""

from __future__ import annotations

import pytest

from hybrid_rl.studio.fields import describe_path, human_label, path_role
from hybrid_rl.studio.schema import config_schema


@pytest.mark.parametrize("key, label", [
    ("data.train_batch_size", "Train batch size"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "PPO mini batch size"),
    ("actor_rollout_ref.actor.optim.lr", "Learning rate"),
    ("trainer.max_actor_ckpt_to_keep", "Max actor checkpoint to keep"),
    ("actor_rollout_ref.actor.use_kl_loss", "Use KL loss"),
    ("trainer.n_gpus_per_node", "N GPUs per node"),
])
def test_labels_come_from_the_key(key, label):
    assert human_label(key) == label


def test_every_field_has_a_label_and_the_path_fields_are_the_ones_naming_files():
    fields = {f.key: f for f in config_schema()[0]}
    assert all(f.label and f.label[0].isupper() for f in fields.values())
    roles = {k: f.path_role for k, f in fields.items() if f.path_role}
    assert roles["actor_rollout_ref.model.path"] == roles["reward_model.model.path"] == "model"
    assert roles["data.train_files"] == roles["custom_reward_function.path"] == "file"
    assert roles["trainer.default_local_dir"] == "output"
    assert "trainer.project_name" not in roles and "data.prompt_key" not in roles
    assert path_role("actor_rollout_ref.rollout.multi_turn.tool_config_path") == "file"


def test_a_path_says_whether_it_exists(tmp_path, tiny_model_dir):
    (tmp_path / "a.parquet").write_text("x")
    (tmp_path / "b.parquet").write_text("x")
    assert describe_path("file", str(tmp_path / "a.parquet")) == {"state": "ok", "message": "a file"}
    assert describe_path("file", str(tmp_path / "*.parquet")) == {"state": "ok", "message": "the pattern matches"}
    assert describe_path("file", ["http://a/x", "${data.val_files}"]) == {"state": "note",
                                                                          "message": "a URL (not checked here)"}
    assert path_role("async_training.buffer.path") == "output"
    assert describe_path("output", str(tmp_path / "a.parquet"))["message"] == "exists"
    missing = describe_path("file", [str(tmp_path / "a.parquet"), "/no/such.parquet"])
    assert missing["state"] == "missing" and missing["message"].startswith("/no/such.parquet: does not exist")
    assert describe_path("file", None) is None and describe_path("file", []) is None
    assert describe_path("file", "http://127.0.0.1:8000/score")["state"] == "note"
    assert describe_path("model", "HuggingFaceTB/SmolLM2-135M-Instruct")["message"].startswith("the embedded model")
    assert describe_path("model", str(tiny_model_dir)) == {"state": "ok", "message": "a model folder"}
    assert describe_path("model", str(tmp_path))["state"] == "missing"  # a folder without config.json
    assert describe_path("model", "${actor_rollout_ref.model.path}")["state"] == "note"
    assert describe_path("output", str(tmp_path / "new"))["message"].endswith("the run creates it")
