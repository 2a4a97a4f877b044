"""The core reads a mode's config through the base sections and the ``own_pools()`` method only."""

import dataclasses
from types import SimpleNamespace

from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.core.single_process import single_process_blockers


def _base(**extra):
    trainer = SimpleNamespace(nnodes=1, n_gpus_per_node=1, max_restarts=0, worker_call_timeout_s=None)
    return SimpleNamespace(trainer=trainer, ray_init=SimpleNamespace(address=None), data=None, **extra)


def test_a_config_with_the_base_sections_only_can_run_in_one_process():
    assert single_process_blockers(_base()) == []


def test_the_pools_a_mode_reserves_block_one_process():
    assert single_process_blockers(_base(own_pools=lambda: ["a pool (x.y=1)"])) == ["a pool (x.y=1)"]


def test_ppo_names_its_decoupled_rollout_pool_and_teacher_pool():
    cfg = to_ppo_config(get_config())
    assert cfg.own_pools() == []
    decoupled = dataclasses.replace(cfg, async_training=dataclasses.replace(cfg.async_training, enable=True))
    assert decoupled.own_pools() == ["a separate rollout pool (async_training.enable)"]
    assert single_process_blockers(decoupled) == ["a separate rollout pool (async_training.enable)"]
