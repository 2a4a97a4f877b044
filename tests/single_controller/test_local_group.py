"""LocalWorkerGroup: the worker in the driver's process answers every call as a 1-rank Ray group does."""

import os

import pytest
import torch
from toy_workers import ToyCritic, ToyWorker, make_batch

from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import RayClassWithInitArgs, WorkerGroupFuture, create_colocated_worker_cls
from hybrid_rl.single_controller.local import LocalFuture, LocalWorkerGroup


@pytest.fixture
def group():
    wg = LocalWorkerGroup(RayClassWithInitArgs(ToyWorker, scale=1.0))
    yield wg
    wg.shutdown()


def test_every_dispatch_mode_as_one_rank(group):
    out = group.double(make_batch(3))
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]
    assert out.batch["y"][:, 1].tolist() == [0.0, 20.0, 40.0] and out.batch["rank"].tolist() == [0, 0, 0]
    assert out.meta_info["metrics"] == {"rows_per_rank": [3]}
    assert group.row_stats(make_batch(2)) == [{"rank": 0, "rows": 2, "uids": ["u0", "u1"]}]
    assert group.echo(["a"]) == [(0, ("a",), {})]
    assert group.echo("same", k=1) == [(0, ("same",), {"k": 1})]
    assert group.echo_dp([10]) == [(0, 10)]
    assert group.echo_rank_zero("z") == (0, "z")
    assert group.echo_execute_rank_zero("z") == (0, "z")
    assert group.execute_all_sync("echo_dp", 5) == [(0, 5)]
    assert group.execute_rank_zero("echo_dp", 6) == (0, 6)
    assert group.world_size == 1 and group.worker_infos[0].pid == os.getpid()


def test_futures_chain_like_ray_futures(group):
    future = group.double_async(make_batch(3))
    assert isinstance(future, WorkerGroupFuture) and future.done()
    assert group.add_one(future).batch["y"][:, 0].tolist() == [1.0, 3.0, 5.0]
    assert [s["uids"] for s in group.row_stats(future)] == [["u0", "u1", "u2"]]
    assert future.get().batch["y"][:, 0].tolist() == [0.0, 2.0, 4.0]  # add_one did not change it
    assert group.echo_dp(group.echo_async("v")) == [(0, (0, "v"))]  # a per-rank future scattered


def test_an_error_is_raised_where_a_ray_future_raises_it(group):
    with pytest.raises(ValueError, match="bad input \\(rank 0\\)"):
        group.raise_value_error("bad input")
    future = LocalFuture([], list, "toy.m", group.worker_infos, error=KeyError("late"))
    with pytest.raises(KeyError, match="late"):
        group.add_one(future)  # the consumer of a failed call raises its error
    assert group.double(make_batch(1)).batch["rank"].tolist() == [0]  # the worker still answers


def test_the_drivers_batch_keeps_its_keys(group):
    batch = make_batch(2)
    batch.batch["y"] = torch.zeros(2, 2)
    out = group.add_one(batch)
    assert out.batch["y"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert batch.batch["y"].tolist() == [[0.0, 0.0], [0.0, 0.0]]  # add_one replaced its own key only


def test_colocated_views_and_shutdown_release_the_worker(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the group sets it: restored after the test
    closed = []

    class ClosingCritic(ToyCritic):
        def close(self) -> None:
            closed.append("critic")

    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(ToyWorker, scale=2.0),
                                       "critic": RayClassWithInitArgs(ClosingCritic, offset=100.0)})
    threads = torch.get_num_threads()
    try:
        wg = LocalWorkerGroup(cls, num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    views = wg.spawn({"actor", "critic"})
    batch = make_batch(2)
    assert views["actor"].double(batch).batch["y"][:, 0].tolist() == [0.0, 4.0]
    assert views["critic"].double(views["actor"].double_async(batch)).batch["v"][:, 0].tolist() == [100.0, 102.0]
    assert views["critic"].pid() == [os.getpid()] and views["critic"].worker_infos[0].role == "critic"
    views["actor"].shutdown()  # through any view: the one worker is gone for all
    assert closed == ["critic"] and wg.worker is None
    with pytest.raises(RuntimeError, match="critic.pid. called after the worker group was shut down"):
        views["critic"].pid()
    views["critic"].shutdown()  # idempotent
    assert closed == ["critic"]


def test_shutdown_gives_back_the_process_group_and_its_port(monkeypatch):
    """The worker's own 1-rank group picked MASTER_ADDR/PORT for this process; after shutdown neither the
    group nor the variables remain, so a run started later from here (a subprocess inherits the
    environment) never tries to listen on a port this process held."""
    import socket

    import torch.distributed as dist

    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    wg = LocalWorkerGroup(RayClassWithInitArgs(ToyWorker, scale=1.0))
    assert wg.all_reduce_rank_plus_one() == [1.0] and dist.is_initialized()
    port = int(os.environ["MASTER_PORT"])
    wg.shutdown()
    assert not dist.is_initialized() and "MASTER_PORT" not in os.environ and "MASTER_ADDR" not in os.environ
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", port))  # free again


def test_same_answers_as_a_one_rank_ray_group(tmp_path):
    """The same calls on a 1-rank Ray group and in-process give equal outputs."""
    import ray

    from hybrid_rl.single_controller import RayResourcePool, RayWorkerGroup, init_ray

    here = os.path.dirname(os.path.abspath(__file__))
    init_ray(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": here}})
    pool = RayResourcePool([1], use_gpu=False, num_cpus_per_process=1)
    remote = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker, scale=3.0))
    local = LocalWorkerGroup(RayClassWithInitArgs(ToyWorker, scale=3.0))
    try:
        for wg_calls in [lambda g: g.double(make_batch(4)), lambda g: g.add_one(g.double_async(make_batch(3))),
                         lambda g: g.row_stats(make_batch(2)), lambda g: g.echo_dp(g.echo_async("v"))]:
            a, b = wg_calls(remote), wg_calls(local)
            if isinstance(a, DataProto):
                assert a.batch.keys() == b.batch.keys()
                assert all(torch.equal(a.batch[k], b.batch[k]) for k in a.batch.keys())
                assert a.meta_info == b.meta_info
            else:
                assert a == b
    finally:
        remote.shutdown()
        pool.remove()
        local.shutdown()
        ray.shutdown()


def test_shutdown_survives_roles_without_close_or_with_a_failing_one(caplog):
    from hybrid_rl.single_controller import Worker

    class Plain:  # a role object that is not a Worker: nothing to close
        def __init__(self):
            pass

    class Failing(Worker):
        def close(self) -> None:
            raise RuntimeError("engine already gone")

    cls = create_colocated_worker_cls({"plain": RayClassWithInitArgs(ToyWorker),
                                       "failing": RayClassWithInitArgs(Failing)})
    wg = LocalWorkerGroup(cls)
    wg.worker.worker_dict["plain"] = Plain()
    wg.shutdown()  # logs the failure, closes the rest, drops the worker
    assert wg.worker is None and "closing the failing worker failed: engine already gone" in caplog.text
