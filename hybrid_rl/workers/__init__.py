"""Model workers: thin Ray shells (``fsdp_workers``) over plain, Ray-free classes.

* :mod:`~hybrid_rl.workers.config` — typed configs (veRL key names),
* :mod:`~hybrid_rl.workers.actor` / :mod:`~hybrid_rl.workers.critic` — PPO actor and critic on one rank,
* :mod:`~hybrid_rl.workers.model_loader` — local HF folders and the embedded SmolLM2 default,
* :mod:`~hybrid_rl.workers.fsdp_utils` — FSDP2 wrapping and full-weight streaming,
* :mod:`~hybrid_rl.workers.checkpoint` — atomic per-worker checkpoints,
* :mod:`~hybrid_rl.workers.fsdp_workers` — ``ActorRolloutRefWorker``, ``CriticWorker``,
* :mod:`~hybrid_rl.workers.rollout` — generation engines (HF, vLLM).

The worker classes are imported on first access, so ``import hybrid_rl.workers.config`` stays cheap
(no Ray, no transformers).
"""

from typing import Any

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hybrid_rl.workers import fsdp_workers

        return getattr(fsdp_workers, name)
    raise AttributeError(f"module 'hybrid_rl.workers' has no attribute {name!r}")
