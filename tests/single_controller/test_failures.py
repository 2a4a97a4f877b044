"""A dead, hung or unstartable worker gives a clear driver-side error within a bounded time, never a hang.

Every test also carries a pytest-timeout guard, so a regression shows up as a failure, not a stuck run.
"""

import os
import time

import pytest
import ray
from toy_workers import ToyWorker

from hybrid_rl.single_controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroupError,
    WorkerGroupTimeoutError,
    init_ray,
)

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_cluster():
    assert not ray.is_initialized()
    init_ray(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": HERE}})
    yield
    ray.shutdown()


@pytest.fixture
def make_group(ray_cluster):
    made = []

    def make(call_timeout_s=None, num_workers=2, **worker_kwargs):
        pool = RayResourcePool([num_workers], use_gpu=False, num_cpus_per_process=0.5)
        made.append((pool, None))
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker, **worker_kwargs), name_prefix=f"fail{len(made)}",
                            call_timeout_s=call_timeout_s)
        made[-1] = (pool, wg)
        return wg

    yield make
    for pool, wg in made:
        if wg is not None:
            wg.shutdown()
        pool.remove()


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_worker_killed_mid_call_names_the_worker_quickly(make_group, how):
    wg = make_group()
    dead = wg.worker_infos[1]
    start = time.monotonic()
    # Rank 1 dies; rank 0 keeps blocking for 120 s as if waiting in a collective for rank 1.
    with pytest.raises(WorkerGroupError) as excinfo:
        wg.die_on(1, how)
    elapsed = time.monotonic() - start
    message = str(excinfo.value)
    assert elapsed < 30, f"took {elapsed:.1f} s to notice the dead worker"
    assert f"ToyWorker rank 1/2 (pid {dead.pid}, node {dead.node_ip}" in message
    assert "during `ToyWorker.die_on`" in message
    assert f"toy worker rank 1 about to die by {how}" in message  # from the worker's own log tail
    assert dead.log_files and any(path in message for path in dead.log_files)


def test_a_peers_collective_error_is_reported_as_the_dead_worker(make_group):
    """The supervisor restarts on a dead worker: the echo of its death in a peer's collective must
    not hide it (seen with a SIGKILL during weight sync on a slow CPU)."""
    wg = make_group()
    with pytest.raises(WorkerGroupError) as excinfo:
        wg.die_after_peer_error(1)
    assert "ToyWorker rank 1/2" in str(excinfo.value) and "died during" in str(excinfo.value)


def test_call_timeout_names_the_silent_worker(make_group):
    wg = make_group(call_timeout_s=3.0)
    start = time.monotonic()
    with pytest.raises(WorkerGroupTimeoutError) as excinfo:
        wg.sleep_on(1, 60.0)
    elapsed = time.monotonic() - start
    message = str(excinfo.value)
    assert 3.0 <= elapsed < 45  # generous for a loaded machine, yet short of the 60 s sleep
    assert "`ToyWorker.sleep_on` did not finish within call_timeout_s=3.0 s: 1 of 2 workers" in message
    assert "ToyWorker rank 1/2" in message and "rank 0/2" not in message
    assert "toy worker rank 1 going to sleep" in message
    assert isinstance(excinfo.value, TimeoutError)


def test_non_blocking_future_of_a_dead_worker_raises_on_get(make_group):
    wg = make_group(num_workers=1)
    pid = wg.worker_infos[0].pid
    future = wg.execute_all_async("die_on", 0, "exit")
    with pytest.raises(WorkerGroupError, match=f"ToyWorker rank 0/1 \\(pid {pid}"):
        future.get()


def test_constructor_failure_is_reported_at_start(make_group):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as excinfo:
        make_group(num_workers=1, fail_init=True)
    assert time.monotonic() - start < 120
    message = str(excinfo.value)
    assert "during `__init__`" in message and "toy worker constructor failure" in message


def test_unsatisfiable_resource_pool_fails_fast(ray_cluster):
    pool = RayResourcePool([64], use_gpu=False, num_cpus_per_process=1, pg_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="could not reserve \\[64\\] processes"):
        pool.get_placement_groups()
    assert time.monotonic() - start < 20
