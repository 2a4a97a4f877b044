"""Partial rollout end to end (``async_training.partial_rollout=true``) through Ray on the tiny model: groups
stream into the SQL buffer; a rollout worker SIGKILLed while loading new weights with requests in flight (mid
partial rollout) resumes: every group trained exactly once, none generated twice, none lost, and every
buffered row keeps per-token versions and behaviour log-probs."""

import glob
import os
from collections import Counter

import pytest

from tests.trainer.test_e2e import _assert_ok, _rows, _run_cli
from tests.trainer.test_e2e_async import DECOUPLED_LOSS, ROWS_PER_STEP, _async_args, _buffer_rows, _reward_args

pytestmark = pytest.mark.slow

N = 2  # rollout.n
GROUPS = ROWS_PER_STEP // N


def _dead_segments(before):
    """Weight segments made since ``before`` whose exporting process is gone (``hybrid_rl_wt_<pid>_...``): the
    run's own once it has ended; a live process's (another test on this machine) may still be in use."""
    def alive(path):
        try:
            os.kill(int(os.path.basename(path).split("_")[3]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    return {p for p in glob.glob("/dev/shm/hybrid_rl_wt_*") if p not in before and not alive(p)}


def _assert_groups_once(rows, steps):
    taken = Counter(e.taken_step for e in rows if e.status == "taken")
    assert taken == {step: ROWS_PER_STEP for step in range(1, steps + 1)}
    per_group = Counter((e.extra["rollout_batch"], e.extra["rollout_group"]) for e in rows)
    assert set(per_group.values()) == {N}  # a group generated twice would have 2n rows
    last = max(b for b, _ in per_group)
    complete = [b for b in range(1, last) if all((b, g) in per_group for g in range(GROUPS))]
    assert complete == list(range(1, last))  # every batch before the newest is whole: no group lost
    for step in range(1, steps + 1):
        groups = [(e.extra["rollout_batch"], e.extra["rollout_group"]) for e in rows if e.taken_step == step]
        assert all(count == N for count in Counter(groups).values())  # whole groups per step


def _assert_versions_and_log_probs(rows, eta):
    """Per-token versions ascend within a row; every row of a group carries the group's oldest first-token
    version (stream_producer.group_versions); behaviour log-probs on model tokens; the staleness bound."""
    firsts = {}
    for e in rows:
        model = [i for i, m in enumerate(e.response_mask) if m]
        versions = e.token_versions or [e.policy_version] * len(e.response_ids)
        tagged = [versions[i] for i in model]
        assert tagged == sorted(tagged) and e.policy_version <= tagged[0]
        firsts.setdefault((e.extra["rollout_batch"], e.extra["rollout_group"]), []).append((e.policy_version, tagged[0]))
        assert e.rollout_log_probs is not None and all(e.rollout_log_probs[i] <= 0 for i in model)
        if e.status == "taken":
            assert (e.taken_step - 1) - e.policy_version <= eta
    for group in firsts.values():
        assert {v for v, _ in group} == {min(first for _, first in group)}


def test_partial_rollout_resumes_after_sigkills_nothing_lost_nothing_twice(tmp_path, tiny_model_dir):
    args = [*_reward_args(tmp_path),
            *_async_args("async_training.buffer.storage_type=sql", "async_training.partial_rollout=true",
                         "async_training.max_head_offpolicyness=1", *DECOUPLED_LOSS),
            "data.max_response_length=16", "trainer.total_training_steps=4", "trainer.max_restarts=1"]
    # the rollout worker dies loading version 2 with requests in flight: the run restarts from its last
    # checkpoint (a fresh driver-side producer, the buffer's groups read back; the driver-kill-and-rerun path
    # is the same load_checkpoint, covered for the batch producer by test_e2e_async)
    env = {"HYBRID_RL_FAULT": "kill:stream_load_weights:2", "HYBRID_RL_FAULT_STATE": str(tmp_path / "faults")}
    shm_before = set(glob.glob("/dev/shm/hybrid_rl_wt_*"))
    first = _run_cli(tmp_path, tiny_model_dir, *args, env=env)
    _assert_ok(first)
    assert _dead_segments(shm_before) == set()  # the run's pushes gave their memory back
    assert "restart 1/1 after a worker failure" in first.stderr + first.stdout
    rows = _buffer_rows(tmp_path / "run")
    _assert_groups_once(rows, steps=4)
    _assert_versions_and_log_probs(rows, eta=1)
    logged = _rows(tmp_path / "run")
    assert logged[-1]["training/global_step"] == 4 and all(r["async/staleness_max"] <= 1 for r in logged)
