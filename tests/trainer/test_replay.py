"""python -m hybrid_rl.debug replay: step K from the checkpoint before it and its dumped batch.

One recorded run per module (the tiny model, one worker in this process, 2 steps, a checkpoint after
each, the replay dump on); its steps are replayed and compared with what the run logged and saved.
The run's code identity is pinned (the checkout's commit moves while the suite runs); another
commit is tested by editing ``meta.json``.
"""

import json
import os
import shutil
import stat

import numpy as np
import pytest
import torch

from hybrid_rl.debug import main as debug_main
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer import get_config, run_ppo
from hybrid_rl.trainer.core import batch_file
from hybrid_rl.trainer.core.dumps import StepDumps
from hybrid_rl.trainer.ppo.replay import format_report, replay_step, replayed_steps
from test_e2e import _overrides

PINNED = {"version": "0.0.test", "commit": "0" * 40}
CODE_IDENTITY = batch_file.code_identity  # the real one, before the module's runs pin it
SCORER = "def parts(data_source, solution_str, ground_truth, extra_info=None):\n    return float(len(solution_str) % 3)\n"
LEARNED = ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "critic/advantages/mean")


def recorded_overrides(tmp, model_dir, *extra):
    """The run: the default run's GRPO on the tiny model, with a KL loss (a reference pass) and a custom
    scorer (rewards that vary); ``actor.ppo_mini_batch_size=2``: two shuffled mini-batches per update."""
    (tmp / "parts.py").write_text(SCORER)
    dropped = ("trainer.n_gpus_per_node=2", "trainer.total_training_steps=3")
    return [o for o in _overrides(tmp, model_dir) if o not in dropped] + [
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.single_process=true",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.val_at_end=false",
        f"trainer.rollout_data_dir={tmp}/dumps", "trainer.dump_replay_batch=true",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.shuffle=true",
        f"custom_reward_function.path={tmp}/parts.py", "custom_reward_function.name=parts", *extra]


@pytest.fixture(scope="module")
def pinned_code():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch_file, "code_identity", lambda: dict(PINNED))
        yield


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_model_dir, pinned_code):
    tmp = tmp_path_factory.mktemp("recorded")
    overrides = recorded_overrides(tmp, tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=4")  # on-policy
    run_ppo(get_config(overrides))
    return tmp, overrides


def _rows(run_dir):
    return {r["step"]: r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))}


@pytest.mark.slow
def test_replay_of_step_2_is_bit_identical_on_cpu(recorded, capsys):
    tmp, overrides = recorded
    report = replay_step(str(tmp / "run"), 2, overrides)
    assert report["steps"] == ["compute_ref_log_prob", "compute_advantage", "update_actor"]  # on-policy: no old log-probs
    row = _rows(tmp / "run")[2]
    for key in LEARNED:  # the update's own numbers, replayed exactly
        assert report["metrics"][key]["replayed"] == row[key], key
    assert row["critic/advantages/max"] > 0 and row["actor/grad_norm"] > 0  # the scorer's rewards vary: it learns
    assert all(m["equal"] for m in report["metrics"].values()), format_report(report)
    assert report["weights"] == {"actor": {"tensors": report["weights"]["actor"]["tensors"], "equal": True,
                                           "max_abs_diff": 0.0}}
    assert report["weights"]["actor"]["tensors"] > 0
    text = format_report(report)
    assert text.endswith("bit-identical to the run") and "actor/grad_norm" in text


@pytest.mark.slow
def test_replay_without_overrides_reads_the_config_the_run_recorded(recorded, tmp_path):
    """``replay RUN_DIR --step K`` alone: the run folder's replay.json names the dumps, whose meta.json
    holds the config; a run folder without one, or a recorded secret, is one line naming the fix."""
    tmp, overrides = recorded
    pointer = json.loads((tmp / "run" / "replay.json").read_text())
    assert pointer == {"rollout_data_dir": str(tmp / "dumps")} and os.stat(tmp / "run" / "replay.json").st_mode & 0o777 == 0o600
    report = replay_step(str(tmp / "run"), 2, [])
    assert all(m["equal"] for m in report["metrics"].values()) and report["weights"]["actor"]["equal"]
    bare = tmp_path / "bare"
    shutil.copytree(tmp / "run", bare, ignore=shutil.ignore_patterns("replay.json"))
    assert "names no replay dumps (replay.json" in _one_line_error(str(bare), 2, [])
    meta_path = tmp / "dumps" / "meta.json"
    original = meta_path.read_text()
    try:
        meta = json.loads(original)
        meta["config"]["trainer"]["project_name"] = "***"  # as a redacted secret would read
        meta_path.write_text(json.dumps(meta))
        message = _one_line_error(str(tmp / "run"), 2, [])
        assert "hides trainer.project_name (secrets are never written)" in message
    finally:
        meta_path.write_text(original)


@pytest.mark.slow
def test_replay_of_step_1_starts_from_the_model_and_a_changed_batch_differs(recorded):
    tmp, overrides = recorded
    report = replay_step(str(tmp / "run"), 1, overrides)
    assert report["checkpoint"] is None and all(m["equal"] for m in report["metrics"].values())
    assert report["weights"]["actor"]["equal"]
    # the same replay of a batch whose scores were changed must not claim equality
    folder = tmp / "dumps"
    saved = (folder / "1.batch.pt").read_bytes()
    try:
        batch = batch_file.load_batch(str(folder / "1.batch.pt"))
        batch.batch["token_level_scores"] = batch.batch["token_level_scores"].flip(0)
        batch_file.save_batch(str(folder / "1.batch.pt"), batch)
        changed = replay_step(str(tmp / "run"), 1, overrides)
    finally:
        (folder / "1.batch.pt").write_bytes(saved)
    assert not changed["metrics"]["actor/grad_norm"]["equal"] and not changed["weights"]["actor"]["equal"]
    assert format_report(changed).endswith("NOT bit-identical to the run on the recording device")


@pytest.mark.slow
def test_gae_replays_values_the_critic_update_and_the_kl_controller(tmp_path, tiny_model_dir, pinned_code):
    overrides = recorded_overrides(tmp_path, tiny_model_dir, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                                   "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                                   "actor_rollout_ref.actor.use_kl_loss=false", "trainer.critic_warmup=1")
    run_ppo(get_config(overrides))
    report = replay_step(str(tmp_path / "run"), 2, overrides)
    assert report["steps"] == ["compute_old_log_prob", "compute_ref_log_prob", "compute_values", "compute_advantage",
                               "update_critic", "update_actor"]
    row = _rows(tmp_path / "run")[2]
    for key in ("critic/vf_loss", "critic/grad_norm", "actor/reward_kl_penalty", "actor/grad_norm"):
        assert report["metrics"][key]["replayed"] == row[key], key
    assert all(m["equal"] for m in report["metrics"].values()), format_report(report)
    assert report["weights"]["actor"]["equal"] and report["weights"]["critic"]["equal"]


def _one_line_error(run_dir, step, overrides):
    with pytest.raises(ValueError) as info:
        replay_step(run_dir, step, overrides)
    message = str(info.value)
    assert "\n" not in message and "Fix:" in message
    return message


@pytest.mark.slow
def test_another_config_or_commit_is_refused_in_one_line(recorded):
    tmp, overrides = recorded
    run = str(tmp / "run")
    message = _one_line_error(run, 2, [*overrides, "actor_rollout_ref.actor.optim.lr=0.002"])
    assert "actor_rollout_ref.actor.optim.lr=0.001 in the run, 0.002 here" in message
    meta_path = tmp / "dumps" / "meta.json"
    original = meta_path.read_text()
    try:
        meta_path.write_text(json.dumps({**json.loads(original), "commit": "1" * 40}))
        message = _one_line_error(run, 2, overrides)
        assert f"commit '{'1' * 40}', this is '{'0' * 40}'" in message and f"git checkout {'1' * 40}" in message
    finally:
        meta_path.write_text(original)


@pytest.mark.slow
def test_a_missing_checkpoint_or_batch_names_the_key_to_set(recorded, tmp_path):
    tmp, overrides = recorded
    sparse = tmp_path / "run"
    shutil.copytree(tmp / "run", sparse, ignore=shutil.ignore_patterns("global_step_1"))
    message = _one_line_error(str(sparse), 2, overrides)
    assert "needs the checkpoint saved after step 1" in message and "trainer.save_freq=1" in message
    message = _one_line_error(str(tmp / "run"), 3, overrides)
    assert "step 3 has no dumped batch" in message and "trainer.dump_replay_batch=true" in message
    no_dumps = [o for o in overrides if not o.startswith("trainer.rollout_data_dir=")]
    assert "trainer.rollout_data_dir is null" in _one_line_error(str(tmp / "run"), 2, no_dumps)


@pytest.mark.slow
def test_the_command_line_prints_the_comparison_and_fails_in_one_line(recorded, capsys, tmp_path):
    tmp, overrides = recorded
    debug_main(["replay", str(tmp / "run"), "--step", "2", "--json", str(tmp_path / "r.json"), *overrides])
    out = capsys.readouterr().out
    assert "bit-identical to the run" in out and "actor/pg_loss" in out
    assert json.loads((tmp_path / "r.json").read_text())["metrics"]["actor/grad_norm"]["equal"] is True
    with pytest.raises(SystemExit) as info:
        debug_main(["replay", str(tmp / "run"), "--step", "3", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("hybrid_rl config error: step 3 has no")


@pytest.mark.slow
def test_the_run_wrote_private_files_and_meta(recorded):
    tmp, _ = recorded
    folder = tmp / "dumps"
    for name in ("1.batch.pt", "2.batch.pt", "meta.json"):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600, name
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["device"] == "cpu" and {k: meta[k] for k in PINNED} == PINNED
    assert meta["config"]["trainer"]["dump_replay_batch"] is True


# ---------------------------------------------------------------------- the batch file, no run
def _batch(rows: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    tensors = {"responses": torch.randint(0, 50, (rows, 4), generator=g), "old_log_probs": torch.randn(rows, 4, generator=g),
               "attention_mask": torch.ones(rows, 7, dtype=torch.long), "prompts": torch.zeros(rows, 3, dtype=torch.long),
               "response_mask": torch.ones(rows, 4, dtype=torch.long), "token_level_scores": torch.zeros(rows, 4)}
    columns = {"uid": np.array([f"u{i // 2}" for i in range(rows)], dtype=object),
               "reward_model": np.array([{"ground_truth": str(i), "style": "rule"} for i in range(rows)], dtype=object),
               "num_turns": np.arange(rows, dtype=np.int32)}
    return DataProto.from_dict(tensors, columns, {"eos_token_id": 2, "temperature": 1.0, "global_steps": 3})


def test_the_batch_file_round_trips_every_row_whatever_the_row_limit(tmp_path):
    batch = _batch(6)
    batch.non_tensor_batch["turns"] = np.empty(6, dtype=object)
    for i in range(6):
        batch.non_tensor_batch["turns"][i] = [i, i + 1]  # a list per row: one element each
    dumps = StepDumps(str(tmp_path), tokenizer=None, max_rows=2, replay_batch=True)
    dumps.tokenizer = type("Tok", (), {"batch_decode": staticmethod(lambda ids, **_: ["x"] * len(ids))})()
    from hybrid_rl.trainer.core.dumps import training_part

    dumps.write(4, [training_part(batch)])
    assert len(open(tmp_path / "4.jsonl").readlines()) == 2  # veRL's file is cut
    path = tmp_path / "4.batch.pt"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = batch_file.load_batch(str(path))
    assert len(back) == 6 and back.batch.keys() == batch.batch.keys()
    for key in batch.batch.keys():
        assert torch.equal(back.batch[key], batch.batch[key]) and back.batch[key].dtype == batch.batch[key].dtype
    for key, column in batch.non_tensor_batch.items():
        assert back.non_tensor_batch[key].dtype == column.dtype and list(back.non_tensor_batch[key]) == list(column), key
    assert back.meta_info == batch.meta_info


def test_a_file_that_is_not_a_batch_is_refused(tmp_path):
    path = tmp_path / "x.batch.pt"
    torch.save({"format": 99, "tensors": {}}, path)
    with pytest.raises(ValueError, match="is not a replay batch of format 1"):
        batch_file.load_batch(str(path))


def test_replayed_steps_are_those_after_scoring_without_the_cadence():
    plan = ["generate", "compute_reward", "filter_groups", "compute_old_log_prob", "compute_values",
            "compute_advantage", "update_critic", "update_actor", "dump_rollout", "validate", "save_checkpoint"]
    assert replayed_steps(plan) == ["compute_old_log_prob", "compute_values", "compute_advantage", "update_critic",
                                    "update_actor"]


def test_code_identity_is_this_checkout():
    import subprocess

    import hybrid_rl

    here = CODE_IDENTITY()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(hybrid_rl.__file__), capture_output=True,
                          text=True).stdout.strip()
    assert here["version"] == hybrid_rl.__version__ and here["commit"] == (head or None)
