"""init_ray: unreachable cluster addresses fail fast with the fix; the workers' environment is assembled."""

import os
import socket
import time

import pytest
import ray

import hybrid_rl
from hybrid_rl.single_controller import init_ray
from hybrid_rl.single_controller.ray import worker_env_vars

pytestmark = pytest.mark.timeout(60)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture(autouse=True)
def _no_ray():
    if ray.is_initialized():
        ray.shutdown()
    yield
    assert not ray.is_initialized()


def test_unreachable_address_argument_fails_fast_and_names_it():
    address = f"127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    with pytest.raises(ValueError) as excinfo:
        init_ray(address=address, connect_timeout_s=2)
    assert time.monotonic() - start < 10
    message = str(excinfo.value)
    assert f"cannot reach the Ray cluster at '{address}' (from the address argument)" in message
    assert "ray start --head" in message and "unset both" in message


def test_unreachable_ray_address_env_var_is_named(monkeypatch):
    address = f"127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(ValueError, match=f"'{address}' \\(from the RAY_ADDRESS environment variable\\)"):
        init_ray(connect_timeout_s=2)


def test_malformed_address_is_rejected():
    with pytest.raises(ValueError, match="'headnode' .* is not host:port"):
        init_ray(address="headnode")


def test_worker_env_vars_layering(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("PYTHONPATH", "/driver/path")
    monkeypatch.delenv("HF_HOME", raising=False)
    env = worker_env_vars({"NCCL_DEBUG": "INFO", "PYTHONPATH": "/user/path", "MY_VAR": "x"})
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(hybrid_rl.__file__)))
    assert env["HF_HUB_OFFLINE"] == "1"  # forwarded from the driver
    assert env["TOKENIZERS_PARALLELISM"] == "true"  # driver value beats the default
    assert env["NCCL_DEBUG"] == "INFO" and env["MY_VAR"] == "x"  # user runtime_env wins
    assert "HF_HOME" not in env
    assert env["PYTHONPATH"].split(os.pathsep) == ["/user/path", package_root, "/driver/path"]
