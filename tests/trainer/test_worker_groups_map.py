"""``WorkerGroups`` is a map role -> group with the devices of each unit; shutdown stops each unit once."""

import pytest

from hybrid_rl.trainer.core.worker_groups import WorkerGroups


class Group:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def shutdown(self):
        self.log.append(f"stop {self.name}")


class Pool(Group):
    def remove(self):
        self.log.append(f"free {self.name}")


def _decoupled(log):
    """Colocated actor + critic on one pool; a rollout group hosting the reward model; teachers."""
    colocated = Group("colocated", log)
    workers = WorkerGroups(colocated, colocated, Pool("pool", log))
    rollout = Group("rollout", log)
    workers.add({"rollout": rollout, "reward_model": rollout}, Pool("rollout_pool", log))
    workers.add({"teacher": Group("teacher", log)}, Pool("teacher_pool", log))
    return workers


def test_roles_read_as_a_map_and_as_attributes():
    log = []
    workers = _decoupled(log)
    assert sorted(workers.groups) == ["actor_rollout", "critic", "reward_model", "rollout", "teacher"]
    assert workers.groups["rollout"] is workers.rollout is workers.reward_model
    assert workers.actor_rollout.name == "colocated" and workers.teacher.name == "teacher"
    assert workers.resource_pool.name == "pool" and workers.rollout_pool.name == "rollout_pool"
    assert workers.teacher_pool.name == "teacher_pool" and workers.pool_of("critic").name == "pool"
    bare = WorkerGroups(Group("a", log), None, None)
    assert bare.critic is None and bare.rollout is None and bare.rollout_pool is None and "critic" not in bare.groups
    assert log == []


def test_shutdown_stops_each_unit_once_and_frees_its_pool_in_order():
    log = []
    _decoupled(log).shutdown()
    assert log == ["stop colocated", "free pool", "stop rollout", "free rollout_pool", "stop teacher",
                   "free teacher_pool"]


def test_a_worker_in_the_driver_process_has_no_pool_and_reward_model_training_has_no_actor():
    log = []
    WorkerGroups(Group("local", log), None, None).shutdown()
    WorkerGroups(actor_rollout=None, critic=None, resource_pool=Pool("rm_pool", log),
                 reward_model=Group("rm", log)).shutdown()
    assert log == ["stop local", "stop rm", "free rm_pool"]


def test_a_role_has_one_group():
    workers = WorkerGroups(Group("a", []), None, None)
    with pytest.raises(ValueError, match=r"worker roles \['actor_rollout'\] have a group already"):
        workers.add({"actor_rollout": Group("b", [])}, None)
    with pytest.raises(AttributeError):
        workers._private  # noqa: B018 - private names are not roles
