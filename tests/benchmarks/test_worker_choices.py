"""bench_step.worker_choices / ChoiceLog: the workers' start-up choices, from this process and log files."""

import logging
import os
import sys
import time

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from bench_step import ChoiceLog, worker_choices  # noqa: E402


def test_choices_come_from_this_process_and_the_workers_log_files(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "actor_rollout_0.log").write_text(
        "2026-11-28 10:51:05,488 hybrid_rl.workers.fsdp_utils INFO: FSDP2 groups: the root alone\n"
        "2026-11-28 10:51:05,600 hybrid_rl.workers.actor INFO: something else\n"
        "2026-11-28 10:51:06,220 hybrid_rl.workers.attention_backend INFO: packed attention: rows by varlen_attn, "
        "prompt groups by flex_attention\n")
    (logs / "actor_rollout_1.log").write_text("x INFO: FSDP2 groups: the root alone\n")  # the same line once
    (logs / "teacher").mkdir()  # the teacher and rollout pools log in subfolders
    (logs / "teacher" / "teacher_0.log").write_text("2026-11-28 10:52:00,000 x INFO: precision on cpu: teacher\n")
    logger = logging.getLogger("hybrid_rl.workers.fsdp_utils")
    level = logging.getLogger("hybrid_rl").level
    with ChoiceLog() as choices:
        logger.info("precision on cuda: %s", "param_dtype=bfloat16 (auto)")
        logger.info("not a choice")
    logger.info("FSDP2 groups: after the handler left")
    assert worker_choices(str(tmp_path), list(choices.lines)) == [
        "precision on cuda: param_dtype=bfloat16 (auto)", "FSDP2 groups: the root alone",
        "packed attention: rows by varlen_attn, prompt groups by flex_attention", "precision on cpu: teacher"]
    assert logging.getLogger("hybrid_rl").level == level  # restored
    assert worker_choices(str(tmp_path / "no_run")) == []
    since = time.mktime(time.strptime("2026-11-28 10:51:06", "%Y-%m-%d %H:%M:%S"))  # an earlier run's lines left out
    assert worker_choices(str(tmp_path), since=since) == [  # rank 0's FSDP2 line is older; rank 1's, undated, counts
        "packed attention: rows by varlen_attn, prompt groups by flex_attention", "FSDP2 groups: the root alone",
        "precision on cpu: teacher"]


def test_what_passed_the_logger_before_still_passes_and_nothing_more(caplog):
    """pytest's handler sits on the root as a ``logging.basicConfig()`` one would (no level of its
    own): under the choice log it gets the warning, not the INFO line the logger dropped before."""
    package, logger = logging.getLogger("hybrid_rl"), logging.getLogger("hybrid_rl.workers.attention_backend")
    level = package.level
    package.setLevel(logging.WARNING)
    try:
        with ChoiceLog() as choices:
            logger.info("packed attention: rows by sdpa")
            logger.warning("a fallback worth seeing")
    finally:
        package.setLevel(level)
    assert [r.getMessage() for r in caplog.records] == ["a fallback worth seeing"]
    assert list(choices.lines) == ["packed attention: rows by sdpa"] and package.propagate
