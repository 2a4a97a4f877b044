"""RayWorkerGroup end to end on a small local Ray instance: dispatch modes, futures, env, colocation."""

import os

import pytest
import ray
import torch
from toy_workers import ToyCritic, ToyWorker, make_batch

from hybrid_rl.single_controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroupFuture,
    create_colocated_worker_cls,
    init_ray,
)

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_cluster():
    assert not ray.is_initialized()
    # 4 logical CPUs (Ray accounting only) so a 2-CPU thread-count check fits next to the other groups.
    init_ray(num_cpus=4, runtime_env={"env_vars": {"PYTHONPATH": HERE}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def group(ray_cluster):
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker, scale=1.0), name_prefix="toy")
    yield wg
    wg.shutdown()
    pool.remove()


def test_dp_compute_proto_uneven_batch_right_rows_right_order(group):
    out = group.double(make_batch(5))
    assert group.world_size == 2
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3", "u4"]
    assert out.batch["y"][:, 0].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out.batch["y"][:, 1].tolist() == [0.0, 20.0, 40.0, 60.0, 80.0]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.meta_info["metrics"] == {"rows_per_rank": [3, 3]}


def test_dp_compute_metric_and_other_modes(group):
    assert group.row_stats(make_batch(4)) == [{"rank": 0, "rows": 2, "uids": ["u0", "u1"]},
                                               {"rank": 1, "rows": 2, "uids": ["u2", "u3"]}]
    assert [r["tag"] for r in group.whoami("hi")] == ["hi", "hi"]
    assert group.echo(["a", "b"]) == [(0, ("a",), {}), (1, ("b",), {})]
    assert group.echo("same") == [(0, ("same",), {}), (1, ("same",), {})]
    assert group.echo_dp([10, 11]) == [(0, 10), (1, 11)]
    assert group.echo_rank_zero("z") == (0, "z")
    assert group.echo_execute_rank_zero("z") == (0, "z")
    assert group.execute_all_sync("echo_dp", 5) == [(0, 5), (1, 5)]
    assert group.execute_rank_zero("echo_dp", 6) == (0, 6)


def test_non_blocking_futures_chain_into_the_next_call(group):
    future = group.double_async(make_batch(5))
    assert isinstance(future, WorkerGroupFuture)
    chained = group.add_one(future)  # the driver never fetched `future`
    assert list(chained.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3", "u4"]
    assert chained.batch["y"][:, 0].tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    # Chaining into a call on a different split (DP_COMPUTE_METRIC over 3 rows of the 5... all 5 rows).
    assert [s["uids"] for s in group.row_stats(future)] == [["u0", "u1", "u2"], ["u3", "u4", "u0"]]
    direct = future.get()
    assert direct.batch["y"][:, 0].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and future.done()
    # Per-rank futures scatter rank by rank; plain ObjectRefs of a DataProto work too.
    assert group.echo_dp(group.echo_async("v")) == [(0, (0, "v")), (1, (1, "v"))]
    assert group.double(ray.put(make_batch(3))).batch["rank"].tolist() == [0, 0, 1]


def test_rank_world_size_and_rendezvous_env(group):
    infos = group.whoami("env")
    assert [i["rank"] for i in infos] == [0, 1] and [i["env_rank"] for i in infos] == ["0", "1"]
    assert {i["world_size"] for i in infos} == {2}
    assert [i["local_rank"] for i in infos] == [0, 1]
    assert infos[0]["master"] == infos[1]["master"] and infos[0]["master"][1] > 0
    assert infos[0]["pid"] != infos[1]["pid"]
    assert [w.pid for w in group.worker_infos] == [i["pid"] for i in infos]
    # The environment is usable as-is: a gloo all-reduce of rank+1 over 2 ranks gives 1+2.
    assert group.all_reduce_rank_plus_one() == [3.0, 3.0]


def test_a_seeded_group_draws_seed_plus_rank_streams(ray_cluster):
    import random

    import numpy as np

    from hybrid_rl.utils.seeding import seed_everything

    def draws(seed=None):
        pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker), seed=seed)
        try:
            return [info["draws"] for info in wg.whoami("rng")]
        finally:
            wg.shutdown()
            pool.remove()

    expected = []
    for rank in (0, 1):
        seed_everything(7 + rank)
        expected.append((torch.rand(2).tolist(), float(np.random.rand()), random.random()))
    seeded = draws(seed=7)
    assert seeded == expected and draws(seed=7) == seeded
    unseeded = draws()
    assert unseeded != draws() and expected[0] not in unseeded  # Ray's own clock-seeded streams


def test_cpu_threads_follow_the_cpus_ray_assigned(ray_cluster):
    pool = RayResourcePool([1], use_gpu=False, num_cpus_per_process=2)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker))
    try:
        info = wg.whoami("threads")[0]
        assert (info["threads"], info["omp"]) == (2, "2")
    finally:
        wg.shutdown()
        pool.remove()


def test_colocated_roles_share_one_process_per_rank(ray_cluster):
    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(ToyWorker, scale=1.0),
                                       "critic": RayClassWithInitArgs(ToyCritic, offset=100.0)})
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, cls)
    try:
        assert {"actor_double", "critic_double", "critic_pid"} <= set(wg.method_names)
        views = wg.spawn({"actor", "critic"})
        actor, critic = views["actor"], views["critic"]
        batch = make_batch(3)
        assert actor.double(batch).batch["y"][:, 0].tolist() == [0.0, 2.0, 4.0]
        assert critic.double(batch).batch["v"][:, 0].tolist() == [100.0, 102.0, 104.0]
        assert wg.critic_double(batch).batch["v"][:, 1].tolist() == [100.0, 120.0, 140.0]
        assert not hasattr(critic, "whoami") and not hasattr(actor, "pid")
        # One process per rank hosts both roles.
        assert critic.pid() == [i["pid"] for i in actor.whoami("c")]
        assert actor.worker_infos[1].role == "actor" and critic.worker_infos[1].role == "critic"
        # A future from one role feeds the other role.
        values = critic.double(actor.double_async(batch))
        assert values.batch["v"][:, 0].tolist() == [100.0, 102.0, 104.0]
        with pytest.raises(ValueError, match="unknown roles \\['ref'\\]"):
            wg.spawn({"ref"})
    finally:
        wg.shutdown()
        pool.remove()


def test_spawn_needs_a_colocated_group(group):
    with pytest.raises(ValueError, match="create_colocated_worker_cls"):
        group.spawn({"actor"})


def test_worker_exception_reaches_the_driver_with_its_type(group):
    with pytest.raises(ValueError, match="bad input \\(rank [01]\\)"):
        group.raise_value_error("bad input")
    assert torch.equal(group.double(make_batch(2)).batch["rank"], torch.tensor([0, 1]))
