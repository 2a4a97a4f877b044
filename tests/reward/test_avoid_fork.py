"""A manager in a process that holds the models scores rows of the built-in linear-time parsers in a
thread (no fork of a multi-GiB process); everything else keeps the guard's process isolation."""

import os

from hybrid_rl.reward import NaiveRewardManager, register_reward, unregister_reward
from hybrid_rl.reward.registry import thread_safe_sources


def test_only_builtin_parsers_are_thread_safe():
    assert thread_safe_sources(["arithmetic", "openai/gsm8k", "calculator"])
    assert not thread_safe_sources(["arithmetic", "math"])  # math-verify's symbolic checks
    assert not thread_safe_sources(["no_such_source"])

    @register_reward("avoid_fork_user_source")
    def mine(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    try:
        assert not thread_safe_sources(["avoid_fork_user_source"])
    finally:
        unregister_reward("avoid_fork_user_source")


def test_the_manager_picks_a_thread_only_where_it_may():
    big = NaiveRewardManager(None, num_examine=0, avoid_fork=True)
    assert big._isolation(["arithmetic", "arithmetic"]) == "thread"
    assert big._isolation(["arithmetic", "math"]) is None  # the guard's default: a forked child
    assert NaiveRewardManager(None, num_examine=0)._isolation(["arithmetic"]) is None
    custom = NaiveRewardManager(None, num_examine=0, compute_score=lambda **kw: 1.0, avoid_fork=True)
    assert custom._isolation(["arithmetic"]) is None
    forced = NaiveRewardManager(None, num_examine=0, isolation="process", avoid_fork=True)
    assert forced._isolation(["arithmetic"]) == "process"


def test_scores_are_the_same_in_the_thread(monkeypatch):
    forks = []
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or (_ for _ in ()).throw(AssertionError("forked")))
    from hybrid_rl.reward.guard import safe_score_many
    from hybrid_rl.reward.registry import default_compute_score

    calls = [((), dict(data_source="arithmetic", solution_str=s, ground_truth="12")) for s in ("#### 12", "#### 13")]
    outcomes = safe_score_many(default_compute_score, calls, timeout_s=5.0, isolation="thread")
    assert [o.score for o in outcomes] == [1.0, 0.0] and not forks
