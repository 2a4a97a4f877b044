"""Shared fixtures: seeding and a tiny hub-free model folder."""

import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
