"""No worker class subclasses another mode's worker: the actor, the critic and the reward model are
siblings; the critic and the reward model share only the mode-neutral ScalarModelWorker."""

import inspect

from hybrid_rl.single_controller import Worker
from hybrid_rl.workers import ActorRolloutRefWorker, CriticWorker, fsdp_workers, rm_worker, scalar_worker
from hybrid_rl.workers.rm_worker import RewardModelWorker
from hybrid_rl.workers.scalar_worker import ScalarModelWorker

NEUTRAL = {Worker, ScalarModelWorker}
"""Bases every mode may share."""


def _mode_workers() -> set[type]:
    found = set()
    for module in (fsdp_workers, rm_worker, scalar_worker):
        found |= {c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, Worker) and c.__module__ == module.__name__}
    return found - NEUTRAL


def test_no_worker_subclasses_another_modes_worker():
    workers = _mode_workers()
    assert {ActorRolloutRefWorker, CriticWorker, RewardModelWorker} <= workers
    for a in workers:
        for b in workers:
            assert a is b or not issubclass(a, b), f"{a.__name__} subclasses {b.__name__}"


def test_the_scalar_workers_share_the_neutral_base():
    assert issubclass(CriticWorker, ScalarModelWorker) and issubclass(RewardModelWorker, ScalarModelWorker)
    assert not issubclass(ActorRolloutRefWorker, ScalarModelWorker)
    for name in ("save_checkpoint", "load_checkpoint"):  # one implementation, the base's
        assert getattr(CriticWorker, name) is getattr(RewardModelWorker, name) is getattr(ScalarModelWorker, name)
