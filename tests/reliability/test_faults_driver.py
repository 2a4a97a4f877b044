"""Driver-side fault handling without Ray (in-process fake workers from tests/trainer/trainer_fakes.py).

Covered: restart after a worker failure (final weights == uninterrupted run), giving up past
trainer.max_restarts with the step and call named, a checkpoint write failing with ENOSPC (clear
error, previous checkpoint kept, rerun resumes), the health checks (all rewards failing, non-finite
updates) and the checkpoint-dir probe.
"""

import errno
import logging
import os

import pytest
from test_driver_loop import _overrides, _rows
from trainer_fakes import FakeActorRollout, FakePool

from hybrid_rl.reward import NaiveRewardManager
from hybrid_rl.single_controller import WorkerDiedError, WorkerGroupError
from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.core.checkpoints import CheckpointSaveError
from hybrid_rl.trainer.core.health import HealthMonitor, TrainingHealthError
from hybrid_rl.trainer.core.model_facts import count_model_params
from hybrid_rl.trainer.core.supervisor import run_supervised
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer


class FlakyActor(FakeActorRollout):
    """Fails like a dead worker in ``method`` at the steps in ``fail_at`` (each once, shared set)."""

    def __init__(self, method, fail_at, error=None):
        super().__init__()
        self.method, self.fail_at, self.error = method, fail_at, error

    def _maybe_fail(self, name, step):
        if name == self.method and step in self.fail_at:
            self.fail_at.discard(step)
            raise self.error or WorkerDiedError(f"worker actor_rollout rank 1/2 (pid 1) died during `{name}`")

    def update_actor(self, data):
        self._maybe_fail("update_actor", data.meta_info["global_steps"])
        return super().update_actor(data)

    def save_checkpoint(self, path, global_step):
        self._maybe_fail("save_checkpoint", global_step)
        return super().save_checkpoint(path, global_step)


class FakeTrainer(RayPPOTrainer):
    """A trainer whose 'worker group' is an in-process fake (started fresh at every init_workers)."""

    make_actor = FakeActorRollout
    started = 0
    stopped = 0

    def init_workers(self):
        FakeTrainer.started += 1
        self.workers = WorkerGroups(type(self).make_actor(), None, FakePool())

    def shutdown(self):
        FakeTrainer.stopped += int(self.workers is not None)
        super().shutdown()


def _config(run_root, model_dir, *extra):
    return get_config(_overrides(run_root, model_dir, "trainer.val_before_train=false", "trainer.val_at_end=false",
                                 *extra))


def _final_w(run_root, model_dir, *extra, actor=FakeActorRollout):
    FakeTrainer.make_actor = staticmethod(actor)
    trainer = FakeTrainer(_config(run_root, model_dir, *extra))
    captured = {}
    trainer.on_step_end = lambda metrics: captured.update(w=float(trainer.workers.actor_rollout.w))
    run_supervised(trainer, lambda cfg: _capturing(FakeTrainer(cfg), captured))
    return captured["w"]


def _capturing(trainer, captured):
    trainer.on_step_end = lambda metrics: captured.update(w=float(trainer.workers.actor_rollout.w))
    return trainer


@pytest.fixture(scope="module")
def straight_w(tmp_path_factory, tiny_model_dir):
    return _final_w(tmp_path_factory.mktemp("straight"), tiny_model_dir)


def test_worker_failure_restarts_and_matches_uninterrupted(tmp_path, tiny_model_dir, straight_w, caplog):
    fail_at = {3, 5}  # step 3: resume from step 2; step 5: resume from step 4
    FakeTrainer.started = FakeTrainer.stopped = 0
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.trainer.core.supervisor"):
        w = _final_w(tmp_path, tiny_model_dir, "trainer.max_restarts=2",
                     actor=lambda: FlakyActor("update_actor", fail_at))
    assert w == straight_w
    assert FakeTrainer.started == 3 and FakeTrainer.stopped == 3  # every attempt's workers stopped
    restarts = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert len(restarts) == 2
    assert "restart 1/2" in restarts[0] and "training step 3, `update_actor`" in restarts[0]
    assert restarts[0].endswith("global_step_2") and restarts[1].endswith("global_step_4")
    assert [r["step"] for r in _rows(tmp_path / "run")] == [1, 2, 3, 4, 5]  # each step logged once


def test_worker_failure_past_max_restarts_raises_with_step_and_call(tmp_path, tiny_model_dir):
    FakeTrainer.started = FakeTrainer.stopped = 0
    with pytest.raises(WorkerGroupError, match=r"training step 3, `update_actor`: worker actor_rollout rank 1/2") as err:
        _final_w(tmp_path, tiny_model_dir, "trainer.max_restarts=1",
                 actor=lambda: FlakyActor("update_actor", _Always({3})))
    assert FakeTrainer.started == 2 and FakeTrainer.stopped == 2
    # a worker that died (the OOM killer leaves no traceback) gets the memory levers with their values
    assert "see docs/memory.md" in str(err.value) and "ppo_max_token_len_per_gpu (now" in str(err.value)


class _Always(set):
    """A fail_at set that never forgets a step (the failure comes back after every restart)."""

    def discard(self, item):
        pass


def test_disk_full_at_save_keeps_previous_checkpoint(tmp_path, tiny_model_dir, straight_w):
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(CheckpointSaveError) as excinfo:
        _final_w(tmp_path, tiny_model_dir, "trainer.max_restarts=2",  # not restarted: it would fail again
                 actor=lambda: FlakyActor("save_checkpoint", {4}, error=full))
    message = str(excinfo.value)
    run = tmp_path / "run"
    assert "No space left on device" in message and "trainer.default_local_dir" in message
    assert f"{run / 'global_step_2'} stays the resume point" in message
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert not (run / "global_step_4").exists()  # the partial folder is gone, never picked up
    assert _final_w(tmp_path, tiny_model_dir) == straight_w  # the rerun resumes from step 2


def test_all_rewards_failing_stops_after_k_steps(tmp_path, tiny_model_dir, caplog):
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("answer")

    cfg = _config(tmp_path, tiny_model_dir, "trainer.max_consecutive_reward_failures=2")
    trainer = FakeTrainer(cfg)
    trainer.reward_fn = NaiveRewardManager(trainer.tokenizer, num_examine=0, compute_score=broken, timeout_s=5.0)
    trainer.init_workers()
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingHealthError) as excinfo:
        trainer.fit()
    assert trainer.global_steps == 2
    assert "step 2: the reward of every sample failed for 2 consecutive steps" in str(excinfo.value)
    assert "8 errors" in str(excinfo.value) and "fix the reward function" in str(excinfo.value)
    first = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reward error")]
    assert len(first) == 1 and "KeyError" in first[0]  # logged once, with its input:
    assert "ground_truth=" in first[0] and "solution_str=" in first[0]
    row = _rows(tmp_path / "run")[-1]
    assert row["reward/num_errors"] == 8 and row["reward/all_failed"] == 1.0


class NaNActor(FakeActorRollout):
    def update_actor(self, data):
        out = super().update_actor(data)
        out.meta_info["metrics"].update({"actor/num_skipped_steps": [1], "actor/grad_norm": [float("nan")]})
        return out


def test_non_finite_updates_stop_after_k_steps(tmp_path, tiny_model_dir):
    with pytest.raises(TrainingHealthError, match=r"step 3: .* 3 consecutive steps .*lower actor_rollout_ref"):
        _final_w(tmp_path, tiny_model_dir, "trainer.max_consecutive_skipped_updates=3", actor=NaNActor)


def test_health_streaks_reset_and_survive_resume():
    monitor = HealthMonitor(max_consecutive_reward_failures=2, max_consecutive_skipped_updates=None)
    monitor.observe({"reward/all_failed": 1.0, "actor/num_skipped_steps": 1.0}, step=1)
    monitor.observe({"reward/all_failed": 0.0}, step=2)  # a good step resets the streak
    monitor.observe({"reward/all_failed": 1.0}, step=3)
    for step in range(4, 50):  # no limit on skipped updates
        monitor.observe({"actor/num_skipped_steps": 1.0}, step=step)
    resumed = HealthMonitor(max_consecutive_reward_failures=2)
    resumed.load_state_dict({"reward_failure_streak": 1, "skipped_update_streak": 0})
    with pytest.raises(TrainingHealthError, match="2 consecutive steps"):
        resumed.observe({"reward/all_failed": 1.0}, step=4)
    with pytest.raises(ValueError, match=r"trainer.max_consecutive_skipped_updates=0 must be >= 1 or null"):
        HealthMonitor(max_consecutive_skipped_updates=0)


def test_probe_rejects_unwritable_dir_and_full_disk(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"trainer.default_local_dir='.*/file/run' cannot hold the run's files: "
                                         r".*/file is a file, not a folder"):
        RayPPOTrainer(get_config(_overrides(tmp_path, tiny_model_dir, f"trainer.default_local_dir={tmp_path}/file/run")))
    with pytest.raises(ValueError, match="is a file, not a folder"):  # never saves, but logs and metrics go there
        RayPPOTrainer(get_config(_overrides(tmp_path, tiny_model_dir, f"trainer.default_local_dir={tmp_path}/file/run",
                                            "trainer.save_freq=-1")))

    import hybrid_rl.trainer.core.checkpoints as cm

    usage = cm.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(cm.shutil, "disk_usage", lambda path: usage._replace(free=1024))
    params = count_model_params(get_config(_overrides(tmp_path, tiny_model_dir)).actor_rollout_ref.model)
    need = (params * 12 + 64 * 2**20) / 2**30  # fp32 weights + AdamW moments + tokenizer/config allowance
    with pytest.raises(ValueError, match=rf"has 0.00 GiB free but one checkpoint needs about {need:.2f} GiB"):
        RayPPOTrainer(get_config(_overrides(tmp_path, tiny_model_dir)))


def test_fault_spec_parsing_rank_filter_and_fire_once(tmp_path, monkeypatch):
    from hybrid_rl.utils import faults

    with pytest.raises(ValueError, match=r"HYBRID_RL_FAULT entry 'crash:update_actor:2' is not action:point:step"):
        faults.parse_faults("crash:update_actor:2")
    monkeypatch.setenv(faults.FAULT_ENV, "oserror:save_checkpoint:2:1")
    monkeypatch.setenv(faults.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("RANK", "0")
    faults.inject("save_checkpoint", 2)  # another rank: nothing happens
    monkeypatch.setenv("RANK", "1")
    faults.inject("save_checkpoint", 1)  # another step
    with pytest.raises(OSError) as excinfo:
        faults.inject("save_checkpoint", 2)
    assert excinfo.value.errno == errno.ENOSPC
    faults.inject("save_checkpoint", 2)  # fired once already (the marker survives a restart)
