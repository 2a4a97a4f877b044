"""A manager in a process that holds the models scores rows of the built-in linear-time parsers in a
thread (no fork of a multi-GiB process); everything else keeps the guard's process isolation."""

import os

import pytest
import torch

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


def test_a_batch_is_scored_the_same_without_a_fork(monkeypatch):
    from test_manager import make_batch

    from hybrid_rl.utils.testing import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    data = make_batch(tokenizer, ["#### 12", "#### 13", "#### 5"], [12, 12, 5])
    forked = NaiveRewardManager(tokenizer, num_examine=0)(data)  # the guard's child process
    forks = []

    def no_fork():
        forks.append(1)
        raise AssertionError("forked")

    monkeypatch.setattr(os, "fork", no_fork)
    threaded = NaiveRewardManager(tokenizer, num_examine=0, avoid_fork=True)(data)
    assert torch.equal(forked, threaded) and threaded.sum().item() == 2.0 and not forks
    # a source whose scorer is not a built-in parser still goes to the (here refused) child
    mixed = make_batch(tokenizer, ["#### 12"], [12], sources=["math"])
    with pytest.raises(AssertionError, match="forked"):
        NaiveRewardManager(tokenizer, num_examine=0, avoid_fork=True)(mixed)
    assert forks
