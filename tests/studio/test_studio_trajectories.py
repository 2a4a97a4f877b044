"""The trajectory viewer's routes on a hand-made dump (tests/studio/trajectory_dumps.py): a run's dump
folders and steps, a step's prompt groups, a group's tokens; half-written files; one line per bad
request; nothing read outside the studio's folders."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib

import pytest

pytest.importorskip("fastapi", reason="the studio extra (fastapi) is not installed")

from hybrid_rl.studio.form import to_yaml  # noqa: E402
from hybrid_rl.studio.server import create_app  # noqa: E402
from hybrid_rl.studio.trajectory_rows import token_pieces  # noqa: E402
from tests.studio.conftest import TOKEN  # noqa: E402
from tests.studio.trajectory_dumps import ROWS, entropy, rollout_log_prob, write_step  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def run(tmp_path, monkeypatch, tiny_model_dir, tokenizer):
    """A run launched from the studio (its studio_config.yaml) whose dumps hold steps 1 and 3."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "studio_config.yaml").write_text(to_yaml({
        "actor_rollout_ref.model.path": "model", "trainer.default_local_dir": "run",
        "trainer.rollout_data_dir": "run/dumps/train", "trainer.validation_data_dir": "run/dumps/val"}))
    for step in (1, 3):
        write_step(run_dir / "dumps" / "train", tokenizer, step)
    return run_dir


@pytest.fixture
def client(run, local_client):
    return local_client(create_app(TOKEN))


def _get(client, route, status=200, **params):
    response = client.get(f"/api/trajectories{route}", params=params)
    assert response.status_code == status, response.json()
    return response.json()


def test_the_runs_config_names_its_dump_folders(client, run):
    out = _get(client, "", run_dir="run")
    newest = max(p.stat().st_mtime_ns for p in (run / "dumps" / "train").iterdir())
    assert out["folders"] == [
        {"name": "train", "path": str(run / "dumps" / "train"), "steps": [1, 3], "updated": newest},
        {"name": "val", "path": str(run / "dumps" / "val"), "steps": [], "updated": 0}]
    assert out["notes"] == []


def test_a_step_lists_its_groups_with_grpos_advantages(client):
    out = _get(client, "/step", run_dir="run", folder="train", step="3")
    assert out["rows"] == len(ROWS) and [g["uid"] for g in out["groups"]] == ["calc", "plain"]
    calc, plain = out["groups"]
    assert [r["row"] for r in calc["rows"]] == [0, 1] and [r["row"] for r in plain["rows"]] == [2, 3, 4]
    assert calc["score_mean"] == 0.5 and plain["score_mean"] == pytest.approx(1 / 3)
    # GRPO: (score - group mean) / group std (unbiased): +-1/sqrt(2) for [1, 0]; 2/sqrt(3), -1/sqrt(3) for [1, 0, 0]
    assert [r["advantage"] for r in calc["rows"]] == pytest.approx([0.5 ** 0.5, -0.5 ** 0.5], abs=1e-5)
    assert [r["advantage"] for r in plain["rows"]] == pytest.approx([2 / 3 ** 0.5, -1 / 3 ** 0.5, -1 / 3 ** 0.5],
                                                                    abs=1e-5)
    assert calc["advantage_sum"] == pytest.approx(0, abs=1e-5) and plain["advantage_sum"] == pytest.approx(0, abs=1e-5)
    first = calc["rows"][0]
    model = [t for t in range(first["length"]) if t < 98 or t >= 151]  # the tool observation is tokens 98-150
    assert first["model_tokens"] == len(model) and first["observations"] == 1
    assert first["mismatch"] == pytest.approx(sum(abs(rollout_log_prob(t) + 0.5) for t in model) / len(model), abs=1e-6)
    assert calc["mismatch_max"] == max(r["mismatch"] for r in calc["rows"])
    assert plain["length_max"] == max(r["length"] for r in plain["rows"]) == 17


def test_a_group_gives_each_tokens_piece_role_and_values(client, tokenizer):
    out = _get(client, "/group", run_dir="run", folder="train", step="1", uid="calc")
    assert out["notes"] == [] and "What is 6 * 7?" in out["input"] and out["gts"] == "42"
    called, corrected = out["rows"]
    for row in (called, corrected):  # the pieces join to the decoded response, special tokens kept
        assert "".join(row["pieces"]) == tokenizer.decode(row["ids"], skip_special_tokens=False)
    assert set(called["roles"][98:151]) == {"tool"} and set(called["roles"][:98] + called["roles"][151:]) == {"model"}
    assert [t["role"] for t in called["turns"]] == ["model", "tool", "model"]
    assert [t["role"] for t in corrected["turns"]] == ["model", "environment", "model"]
    assert called["turns"][0]["calls"] == [{"name": "calculator", "arguments": {"expression": "6*7"}, "error": None}]
    assert "<tool_response>42</tool_response>" in called["turns"][1]["text"] and "calls" not in called["turns"][1]
    values = called["values"]
    assert values["gap"][100] is None and values["gap"][4] == pytest.approx(rollout_log_prob(4) + 0.5, abs=1e-5)
    assert values["entropy"][:5] == [entropy(t) for t in range(5)]
    assert values["log_prob"][:3] == [-0.5] * 3  # the training log-prob first
    assert values["rollout_log_prob"][:3] == pytest.approx([rollout_log_prob(t) for t in range(3)])
    assert values["advantage"][0] == pytest.approx(called["advantage"], abs=1e-5) and values["advantage"][100] == 0.0
    assert called["agent"] == {"num_turns": 4} and called["verl"]["acc"] is True


def test_a_character_of_two_tokens_is_shown_by_the_token_that_ends_it(client, tokenizer):
    row = _get(client, "/group", run_dir="run", folder="train", step="1", uid="plain")["rows"][1]
    at = row["pieces"].index("\u00e9")
    assert row["pieces"][at - 1] == "" and "".join(row["pieces"][at - 4:at + 1]) == "caf\u00e9"
    ids = tokenizer.encode("\u00e9\u00e9", add_special_tokens=False)  # 2 bytes each
    assert token_pieces(lambda i: tokenizer.decode(i), ids) == ["", "\u00e9", "", "\u00e9"]
    cut = tokenizer.encode("a\u00e9", add_special_tokens=False)[:-1]  # ends inside the character
    assert "".join(token_pieces(lambda i: tokenizer.decode(i), cut)) == tokenizer.decode(cut)


def test_a_step_being_written_shows_its_complete_rows(client, run, tokenizer):
    sidecar = run / "dumps" / "train" / "3.sidecar.jsonl"
    text = sidecar.read_bytes()
    lines = text.split(b"\n")
    sidecar.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:50])  # two rows, the third half-written
    assert _get(client, "/step", run_dir="run", folder="train", step="3")["rows"] == 2
    gz_folder = run / "dumps" / "val"
    _, side = write_step(gz_folder, tokenizer, 2, compress=True)
    whole = gzip.decompress(open(side, "rb").read())
    cut = gzip.compress(whole)[:-40]  # the stream cut short: the rows it holds whole
    with open(side, "wb") as f:
        f.write(cut)
    held = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut).count(b"\n")  # complete lines in what is there
    assert 0 < _get(client, "/step", run_dir="run", folder="val", step="2")["rows"] == held < len(ROWS)
    assert _get(client, "", run_dir="run")["folders"][1]["steps"] == [2]


@pytest.mark.parametrize("params, status, message", [
    ({"run_dir": "run", "folder": "nope", "step": "1"}, 404,
     "folder='nope' is not a dump folder of {run} (its folders: train, val). Fix: pick one of those"),
    ({"run_dir": "run", "folder": "train", "step": "two"}, 400,
     "step='two' is not a step number. Fix: give one of the dumped steps (1, 3)"),
    ({"run_dir": "run", "folder": "train", "step": "2"}, 404,
     "step 2 has no dump in {run}/dumps/train (its steps: 1, 3). Fix: pick one of those steps"),
    ({"run_dir": "run", "folder": "train", "step": "1", "uid": "nope"}, 404,
     "uid='nope' is not a prompt group of step 1 (train). Fix: pick a uid from the step's groups"),
    ({"run_dir": "", "folder": "train", "step": "1"}, 400,
     "run_dir is missing. Fix: give a run's folder (trainer.default_local_dir)"),
    ({"run_dir": "run/studio_config.yaml", "folder": "train", "step": "1"}, 400,
     "run_dir='run/studio_config.yaml' is not a folder. Fix: give a run's trainer.default_local_dir"),
])
def test_a_bad_request_gets_one_line(client, run, params, status, message):
    route = "/group" if "uid" in params else "/step"
    assert _get(client, route, status, **params) == {"error": message.format(run=run)}


def test_nothing_outside_the_studios_folders_is_read(client, run, tmp_path_factory, tokenizer, local_client):
    outside = tmp_path_factory.mktemp("outside_dumps")
    write_step(outside / "dumps", tokenizer, 5)
    refusal = _get(client, "/step", 403, run_dir=str(outside), folder=".", step="5")["error"]
    assert refusal.startswith(f"run_dir='{outside}' is outside the studio's folders")
    (run / "dumps" / "train" / "7.jsonl").symlink_to(outside / "dumps" / "5.jsonl")  # a link out
    (run / "dumps" / "train" / "7.sidecar.jsonl").symlink_to(outside / "dumps" / "5.sidecar.jsonl")
    linked = _get(client, "/step", 403, run_dir="run", folder="train", step="7")["error"]
    assert "link outside the studio's folders" in linked
    (run / "studio_config.yaml").write_text(to_yaml({  # a dump folder and a tokenizer outside: named, not read
        "actor_rollout_ref.model.path": str(outside), "trainer.rollout_data_dir": str(outside / "dumps"),
        "trainer.validation_data_dir": "run/dumps/train"}))
    out = _get(client, "", run_dir="run")
    assert [f["name"] for f in out["folders"]] == ["val"]
    assert out["notes"][0].startswith(f"trainer.rollout_data_dir='{outside / 'dumps'}' is outside the studio's folders")
    group = _get(client, "/group", run_dir="run", folder="val", step="1", uid="plain")
    assert group["rows"][0]["pieces"] is None and group["notes"][-1].startswith(
        f"the tokenizer '{outside}' is outside the studio's folders")
    tokenless = local_client(create_app(TOKEN), token=None)
    assert tokenless.get("/api/trajectories", params={"run_dir": "run"}).status_code == 401


def test_a_command_line_run_is_scanned_and_its_meta_names_the_tokenizer(client, run, tmp_path_factory, tokenizer):
    (run / "studio_config.yaml").write_text("trainer:\n  total_training_steps: many\n")  # edited by hand, wrongly
    out = _get(client, "", run_dir="run")
    assert out["notes"][0].startswith(f"{run / 'studio_config.yaml'} does not compose (")
    assert out["notes"][0].endswith("dump folders were looked for in the run folder instead")
    assert [f["name"] for f in out["folders"]] == ["dumps/train"]
    (run / "studio_config.yaml").unlink()  # a run started from the command line
    outside = tmp_path_factory.mktemp("outside_scan")
    write_step(outside / "dumps", tokenizer, 4)
    (run / "elsewhere").symlink_to(outside)  # a link out of the studio's folders: not looked into
    out = _get(client, "", run_dir="run")
    assert [(f["name"], f["steps"]) for f in out["folders"]] == [("dumps/train", [1, 3])]
    group = _get(client, "/group", run_dir="run", folder="dumps/train", step="1", uid="calc")
    assert group["rows"][0]["pieces"] is None and "names no tokenizer" in group["notes"][0]
    meta = {"config": {"actor_rollout_ref": {"model": {"path": "model"}}}}
    (run / "dumps" / "train" / "meta.json").write_text(json.dumps(meta))  # as trainer.dump_replay_batch writes it
    group = _get(client, "/group", run_dir="run", folder="dumps/train", step="1", uid="calc")
    assert group["notes"] == [] and group["rows"][0]["pieces"][:3] == ["L", "e", "t"]
    assert _get(client, "", run_dir="run/dumps/train")["folders"][0]["name"] == "."  # the dump folder itself


def test_a_run_with_dumps_keeps_the_entropy_for_the_viewer(tmp_path, tiny_model_dir, monkeypatch, local_client):
    """The old-log-prob step's entropys reach the sidecar (the fake actor's are 1.0) and the token view."""
    from hybrid_rl.trainer.config.loader import get_config
    from hybrid_rl.trainer.core.worker_groups import WorkerGroups
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
    from tests.trainer.trainer_fakes import FakeActorRollout, FakePool

    monkeypatch.chdir(tmp_path)
    overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.arithmetic.cache_dir={tmp_path}/data",
                 "data.arithmetic.num_train=8", "data.arithmetic.num_test=2", "data.arithmetic.num_shots=0",
                 "data.train_batch_size=4", "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two updates a step: the old log-probs are computed
                 "trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
                 "trainer.val_before_train=false", "trainer.progress_bar=false",
                 f"trainer.default_local_dir={tmp_path}/run", f"trainer.rollout_data_dir={tmp_path}/run/dumps"]
    trainer = RayPPOTrainer(get_config(overrides))
    trainer.workers = WorkerGroups(FakeActorRollout(), None, FakePool())
    trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "dumps" / "1.sidecar.jsonl")]
    assert len(rows) == 8 and all(r["entropys"] == [1.0] * len(r["response_ids"]) for r in rows)
    client = local_client(create_app(TOKEN))
    step = _get(client, "/step", run_dir="run", folder="dumps", step="1")
    uid = step["groups"][0]["uid"]
    group = _get(client, "/group", run_dir="run", folder="dumps", step="1", uid=uid)
    assert group["rows"][0]["values"]["entropy"] == [1.0] * group["rows"][0]["length"]
    assert os.path.isfile(tmp_path / "run" / "dumps" / "1.jsonl")


def test_requests_compose_configs_one_at_a_time():
    """The viewer composes a run's config in a request thread while the form's checks compose theirs:
    Hydra's one global state takes one composition at a time (it raised 'GlobalHydra is already
    initialized' before)."""
    import threading

    from hybrid_rl.trainer.config.loader import get_config

    errors, sizes = [], []

    def compose(size: int) -> None:
        for _ in range(2):
            try:
                sizes.append(get_config([f"data.train_batch_size={size}"]).data.train_batch_size == size)
            except ValueError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=compose, args=(size,)) for size in (2, 4, 8, 16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sizes == [True] * 8
