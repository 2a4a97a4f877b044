"""The step timeline of a decoupled run through Ray on the tiny model (2 steps, eta = 1): the producer's
lanes and the trainer's on one wall-clock axis, the producer generating while the trainer trains."""

import json

import pytest

from hybrid_rl.trainer.core.timeline import TIMELINE_FILE
from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli
from tests.trainer.test_e2e_async import DECOUPLED_LOSS, _async_args, _reward_args

pytestmark = pytest.mark.slow


def _overlap(a: dict, b: dict) -> float:
    return min(a["end"], b["end"]) - max(a["start"], b["start"])


def test_a_decoupled_runs_producer_and_trainer_lanes_overlap_in_time(tmp_path, tiny_model_dir):
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, *_reward_args(tmp_path), *_async_args(*DECOUPLED_LOSS),
                        "trainer.total_training_steps=2", "trainer.save_freq=-1"))
    run = tmp_path / "run"
    spans = [json.loads(line) for line in open(run / TIMELINE_FILE, encoding="utf-8")]
    metrics = {r["step"]: r for r in _rows(run)}
    lanes = {s["worker"] for s in spans}
    assert {"trainer", "rollout"} <= lanes and any(lane.startswith("reward/") for lane in lanes), lanes
    trainer = [s for s in spans if s["worker"] == "trainer"]
    for step in (1, 2):
        mine = {s["name"]: s for s in trainer if s["step"] == step}
        # the last step validates (val_at_end), which pushes the weights itself
        pushed = "sync_rollout_weights" if step == 1 else "validate"
        assert {"step", "take_experiences", "wait_batch", "update_actor", pushed} <= set(mine), (step, spans)
        for name in ("take_experiences", "update_actor", pushed):
            assert mine[name]["end"] - mine[name]["start"] == pytest.approx(metrics[step][f"timing_s/{name}"], abs=1e-6)
        wait, take = mine["wait_batch"], mine["take_experiences"]  # the wait nests in the step that waits
        assert wait["end"] - wait["start"] == pytest.approx(metrics[step]["timing_s/trainer_idle"], abs=1e-6)
        assert take["start"] <= wait["start"] <= wait["end"] <= take["end"] + 1e-6
    rollout = [s for s in spans if s["worker"] == "rollout"]
    generated = sorted(s["batch"] for s in rollout if s["name"] == "generate")
    assert generated[:2] == [1, 2], spans  # the batches of steps 1 and 2 (the producer may start batch 3)
    assert [s["version"] for s in rollout if s["name"] == "load_weights"][:2] == [0, 1]
    rewards = [s for s in spans if s["worker"].startswith("reward/")]
    assert sorted(s["batch"] for s in rewards)[:2] == [1, 2]
    # decoupled: batch 2 is generated while step 1 trains
    work = [s for s in trainer if s["name"] not in ("step", "wait_batch")]
    assert any(_overlap(g, t) > 0 for g in rollout if g["name"] == "generate" for t in work)


def test_a_streaming_runs_rollout_lane_is_runs_of_pumps_and_waits_never_overlapping(tmp_path, tiny_model_dir):
    """``async_training.partial_rollout=true``: ``generate`` is a run of engine pumps, a group's ``reward``
    is scored on a ``reward/<i>`` lane, the weights' loads interrupt the runs."""
    _assert_ok(_run_cli(tmp_path, tiny_model_dir, *_reward_args(tmp_path),
                        *_async_args("async_training.partial_rollout=true", *DECOUPLED_LOSS),
                        "trainer.total_training_steps=2", "trainer.save_freq=-1"))
    spans = [json.loads(line) for line in open(tmp_path / "run" / TIMELINE_FILE, encoding="utf-8")]
    rollout = sorted((s for s in spans if s["worker"] == "rollout"), key=lambda s: s["start"])
    assert {"generate", "load_weights", "validate"} <= {s["name"] for s in rollout}, spans
    assert [s["version"] for s in rollout if s["name"] == "load_weights"][:2] == [0, 1]
    for a, b in zip(rollout, rollout[1:]):  # one stage, one thing at a time
        assert a["end"] <= b["start"] + 1e-6, (a, b)
    rewards = [s for s in spans if s["worker"].startswith("reward/")]
    groups = {s["batch"] for s in rewards}
    assert {1, 2} <= groups and len(rewards) >= 8  # data.train_batch_size=4 groups per batch, each scored
    work = [s for s in spans if s["worker"] == "trainer" and s["name"] not in ("step", "wait_batch")]
    assert any(_overlap(g, t) > 0 for g in rollout if g["name"] == "generate" for t in work)
