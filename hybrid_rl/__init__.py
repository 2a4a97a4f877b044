"""hybrid_rl: reinforcement-learning post-training of language models (PPO, GRPO, ...).

A single driver process holds the trainer; model work runs in colocated Ray worker groups
(FSDP actor + reference + rollout engine + critic in one process per device). Batches cross the
driver/worker boundary only as :class:`hybrid_rl.protocol.DataProto`.

Submodules are imported lazily by users (``from hybrid_rl.trainer import ...``) so that
``import hybrid_rl`` stays cheap.
"""

__version__ = "0.1.0"
