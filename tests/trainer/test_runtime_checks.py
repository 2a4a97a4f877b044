"""The config checks read configs only; the run's state on disk (run folder, resume point) is the
runtime's (hybrid_rl/trainer/core/runtime_checks.py), checked by the trainer and by ``--cfg job``."""

from __future__ import annotations

import pytest

from hybrid_rl.trainer.config.checks import resume_point_problems, validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.core.runtime_checks import check_run_state, run_state_problems


def _cfg(tmp_path, *overrides):
    return to_ppo_config(get_config([f"data.arithmetic.cache_dir={tmp_path}/cache", *overrides]))


def test_a_run_folder_under_a_file_is_the_runtimes_problem(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    cfg = _cfg(tmp_path, f"trainer.default_local_dir={tmp_path}/file/run")
    validate_config(cfg)  # the config alone is fine
    assert run_state_problems(cfg) == [
        f"trainer.default_local_dir='{tmp_path}/file/run' cannot hold the run's files: {tmp_path}/file is a file, "
        "not a folder. Fix: point trainer.default_local_dir at a folder you can write (it is created if missing)."]


def test_a_missing_resume_point_is_checked_only_for_training(tmp_path):
    step = tmp_path / "run" / "global_step_9"
    cfg = _cfg(tmp_path, f"trainer.default_local_dir={tmp_path}/run", "trainer.resume_mode=resume_path",
               f"trainer.resume_from_path={step}")
    validate_config(cfg)
    assert run_state_problems(cfg, resume_point_problems, training=False) == []  # eval / debug load no checkpoint
    expected = (f"resume checkpoint {step} is not a global_step_N folder; point trainer.resume_from_path at one "
                "(e.g. <default_local_dir>/global_step_10) (trainer.resume_mode=resume_path)")
    assert run_state_problems(cfg, resume_point_problems) == [expected]
    with pytest.raises(ValueError) as raised:
        check_run_state(cfg, resume_point_problems)
    assert str(raised.value) == expected


def test_a_fresh_run_has_no_runtime_problem(tmp_path):
    assert run_state_problems(_cfg(tmp_path, f"trainer.default_local_dir={tmp_path}/run")) == []
    assert not (tmp_path / "run").exists()  # the write probe leaves nothing behind
