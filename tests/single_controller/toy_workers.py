"""Toy Worker classes for the single-controller tests (imported by the Ray workers via PYTHONPATH)."""

import os
import random
import signal
import sys
import time

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import Dispatch, Execute, Worker, register


def make_batch(num_rows: int) -> DataProto:
    """Rows i = 0..num_rows-1 with x = [i, 10 i] and uid = "u<i>"."""
    x = torch.stack([torch.arange(num_rows), 10 * torch.arange(num_rows)], dim=1).float()  # [B, 2]
    uid = np.array([f"u{i}" for i in range(num_rows)], dtype=object)
    return DataProto.from_dict({"x": x}, non_tensors={"uid": uid}, meta_info={"temperature": 1.0})


class ToyWorker(Worker):
    """Doubles rows, reports its identity, and can die or hang on request."""

    def __init__(self, scale: float = 1.0, fail_init: bool = False):
        super().__init__()
        if fail_init:
            sys.stderr.write(f"toy worker rank {self.rank} refuses to start\n")
            raise ValueError("toy worker constructor failure")
        self.scale = scale

    def _scaled(self, data: DataProto) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            {"x": data.batch["x"], "y": data.batch["x"] * 2 * self.scale, "rank": torch.full((n,), self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
            meta_info={"metrics": {"rows_per_rank": n}},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return self._scaled(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return self._scaled(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_one(self, data: DataProto) -> DataProto:
        data.batch["y"] = data.batch["y"] + 1
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def first_row_only(self, data: DataProto) -> DataProto:
        return data[:1]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def row_stats(self, data: DataProto) -> dict:
        return {"rank": self.rank, "rows": len(data), "uids": list(data.non_tensor_batch["uid"])}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag: str) -> dict:
        return {"tag": tag, "rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "env_rank": os.environ["RANK"], "master": (self.master_addr, self.master_port),
                "pid": os.getpid(), "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                "draws": (torch.rand(2).tolist(), float(np.random.rand()), random.random())}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, *args, **kwargs) -> tuple:
        return self.rank, args, kwargs

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def echo_dp(self, value) -> tuple:
        return self.rank, value

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def echo_rank_zero(self, value) -> tuple:
        return self.rank, value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def echo_execute_rank_zero(self, value) -> tuple:
        return self.rank, value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def echo_async(self, value) -> tuple:
        return self.rank, value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank_plus_one(self) -> float:
        import torch.distributed as dist

        self.init_process_group(timeout_s=60)
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int, how: str) -> int:
        """Rank ``rank`` dies (``exit`` = os._exit, ``sigkill``); the others block as if in a collective."""
        if self.rank == rank:
            sys.stderr.write(f"toy worker rank {self.rank} about to die by {how}\n")
            sys.stderr.flush()
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        time.sleep(120)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_after_peer_error(self, rank: int) -> int:
        """Rank ``rank`` is SIGKILLed 1 s in; the others fail at once as in a broken collective (their
        error reaches the driver before the death does)."""
        if self.rank != rank:
            raise RuntimeError("gloo/transport/tcp/pair.cc: Read error: Connection reset by peer")
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_on(self, rank: int, seconds: float) -> int:
        if self.rank == rank:
            sys.stderr.write(f"toy worker rank {self.rank} going to sleep\n")
            sys.stderr.flush()
            time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_value_error(self, message: str) -> None:
        raise ValueError(f"{message} (rank {self.rank})")


class ToyCritic(Worker):
    """A second role with a method name (``double``) shared with ToyWorker, to check role routing."""

    def __init__(self, offset: float):
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"v": data.batch["x"] * 2 + self.offset})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()
