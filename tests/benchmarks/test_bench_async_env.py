"""benchmarks/bench_async.py's slow environment: the files it writes load, the environment plays the
built-in game's moves after the set latency, and the agent-loop entry resolves it by its dotted path."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time

import pandas as pd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_async", os.path.join(REPO, "benchmarks", "bench_async.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slow_environment_answers_like_the_game_after_its_latency(tmp_path, monkeypatch):
    from hybrid_rl.agents.agent_loop import load_agent_loop_config
    from hybrid_rl.agents.env import get_env_cls
    from hybrid_rl.agents.guess_number import GuessNumberEnv

    bench = _bench()
    bench.write_task_files(argparse.Namespace(reward="env", latency=0.2), str(tmp_path))
    assert len(pd.read_parquet(tmp_path / "guess_number" / "test.parquet")) > 0
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("slow_env", None)
    (entry,) = load_agent_loop_config(str(tmp_path / "agents.yaml")).values()
    slow_cls = get_env_cls(entry["env"], "agents.yaml")
    slow, plain = slow_cls(**entry["env_kwargs"]), GuessNumberEnv(**entry["env_kwargs"])
    assert slow.reset(seed=3) == plain.reset(seed=3)
    for move in ("8", "12", "10", "abc", "11"):
        start = time.perf_counter()
        answer = asyncio.run(slow.step(move))
        assert time.perf_counter() - start >= 0.2
        assert answer == plain.step(move)


def test_the_longtail_workload_asks_every_tenth_training_prompt_for_a_long_listing(tmp_path):
    bench = _bench()
    bench.write_task_files(argparse.Namespace(reward="none", latency=0.0, workload="longtail"), str(tmp_path))
    train = pd.read_parquet(tmp_path / "longtail" / "train.parquet")
    test = pd.read_parquet(tmp_path / "longtail" / "test.parquet")
    long_rows = [i for i, p in enumerate(train["prompt"]) if p[-1]["content"].startswith(bench.LONG_PREFIX)]
    assert long_rows == list(range(0, len(train), 10)) and len(train) > 20
    assert not any(p[-1]["content"].startswith(bench.LONG_PREFIX) for p in test["prompt"])  # held-out: plain task
    args = argparse.Namespace(workload="longtail", reward="none", long_tokens=256)
    overrides = bench.reward_overrides(args, str(tmp_path), None)
    assert f"data.train_files={tmp_path}/longtail/train.parquet" in overrides
    assert "data.max_response_length=256" in overrides and not any("reward_model" in o for o in overrides)
