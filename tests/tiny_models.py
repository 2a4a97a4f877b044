"""Test-only model folders that need the workers' loaders (kept out of the package: ``hybrid_rl/utils``
must not import ``hybrid_rl/workers``)."""

from __future__ import annotations

import os
from pathlib import Path


def build_tiny_reward_model_dir(path: str | os.PathLike, base_dir: str | os.PathLike, seed: int = 0,
                                mean: float | None = None, std: float | None = None) -> str:
    """A reward-model folder (``LlamaForSequenceClassification``, one bias-free output, the layout
    ``main_rm`` exports) on the tiny model at ``base_dir``, with a random head and, if given, the
    score statistics ``mean`` / ``std`` in its config. Returns ``path`` as a string."""
    import torch
    from transformers import AutoTokenizer

    from hybrid_rl.workers.model_loader import load_value_model

    path = Path(path)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = load_value_model(str(base_dir), override_config={"token_classification_bias": False})
        with torch.no_grad():
            model.score.weight.normal_(0.0, 0.5)
    model.config.architectures = ["LlamaForSequenceClassification"]
    if mean is not None and std is not None:
        model.config.mean, model.config.std = float(mean), float(std)
    model.save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(path)
    return str(path)
