"""``@register``: mark a Worker method as remote surface of its worker group, and say how a call is split.

A worker-group call has three steps, chosen per method by ``@register(dispatch_mode, execute_mode,
blocking)``:

1. **dispatch** (driver): turn the caller's arguments into one ``(args, kwargs)`` per rank;
2. **execute**: run the method on every rank (``Execute.ALL``) or on rank 0 only (``Execute.RANK_ZERO``);
3. **collect** (driver): turn the per-rank outputs into the caller's result.

Dispatch modes (``W`` = world size):

* ``ONE_TO_ALL``: every rank gets the same arguments; result = list of the ``W`` outputs.
* ``ALL_TO_ALL``: as veRL: if *every* argument is a list/tuple of length ``W``, rank ``i`` gets element
  ``i`` of each; otherwise every rank gets the arguments unchanged. Result = list of outputs.
* ``RANK_ZERO``: only rank 0 runs, with the arguments unchanged; result = its output.
* ``DP_COMPUTE``: every argument must be a list/tuple of length ``W``; rank ``i`` gets element ``i``.
  Result = list of outputs.
* ``DP_COMPUTE_PROTO``: every argument is a ``DataProto`` (or a future of one) with the same row count;
  it is padded to a multiple of ``W`` (``pad_dataproto_to_divisor``) and chunked; each rank returns a
  DataProto with one row per input row; the padding rows are dropped on the worker and the chunks are
  concatenated in rank order with ``DataProto.concat`` — the caller gets exactly one row per input row.
* ``DP_COMPUTE_METRIC``: dispatch as ``DP_COMPUTE_PROTO``; result = list of the ``W`` outputs (e.g.
  metric dicts), untouched.

Futures: a non-blocking call (``blocking=False``) returns a
:class:`~hybrid_rl.single_controller.future.WorkerGroupFuture`; it (or a plain Ray ``ObjectRef``) can be
passed straight into the next call. The driver never fetches it: each rank fetches the upstream
outputs itself, then pads/chunks/indexes them exactly as the driver would have (like veRL's
``DataProtoFuture``, every rank fetches the whole upstream batch from the object store).
"""

from __future__ import annotations

import enum
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from hybrid_rl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from hybrid_rl.single_controller.future import WorkerGroupFuture, object_ref_types

__all__ = ["DISPATCH_MODE_FN_REGISTRY", "Dispatch", "Execute", "MAGIC_ATTR", "RegisterSpec", "get_register_spec",
           "register", "registered_methods"]

MAGIC_ATTR = "_hybrid_rl_register_spec"
"""Attribute set on a ``@register``-ed function; holds its :class:`RegisterSpec`."""


class Dispatch(enum.Enum):
    """How a worker-group call splits its arguments over ranks and merges the outputs (module docstring)."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_METRIC = "dp_compute_metric"


class Execute(enum.Enum):
    """Which ranks run the method: all of them, or rank 0 only (its output is returned as is)."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class RegisterSpec:
    """What ``@register`` recorded for one method."""

    dispatch_mode: Dispatch
    """How arguments are split over ranks and outputs merged."""
    execute_mode: Execute
    """Which ranks run the method."""
    blocking: bool
    """True: the group call waits and returns the result; False: it returns a WorkerGroupFuture."""


def register(dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL, execute_mode: Execute = Execute.ALL,
             blocking: bool = True) -> Callable[[Callable], Callable]:
    """Decorator marking a :class:`~hybrid_rl.single_controller.worker.Worker` method as callable on its group.

    The wrapped method also runs the worker-side half of the protocol: it fetches futures passed as
    arguments and, for ``DP_COMPUTE_PROTO``, drops the output rows that belong to padding.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"register(dispatch_mode=...) must be a Dispatch member, got {dispatch_mode!r}; "
                        f"valid: {[m.name for m in Dispatch]}")
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"register(execute_mode=...) must be an Execute member, got {execute_mode!r}; "
                        f"valid: {[m.name for m in Execute]}")
    spec = RegisterSpec(dispatch_mode, execute_mode, bool(blocking))

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"@register does not support async methods ({func.__qualname__}); "
                            "worker-group actors run one synchronous call at a time")

        @functools.wraps(func)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            args, kwargs, rows = _materialize(args, kwargs)
            output = func(self, *args, **kwargs)
            if rows is not None:
                output = _drop_padding_rows(output, rows, func.__name__)
            return output

        setattr(inner, MAGIC_ATTR, spec)
        return inner

    return decorator


def get_register_spec(obj: Any) -> RegisterSpec | None:
    """The :class:`RegisterSpec` of a ``@register``-ed function, else None."""
    return getattr(obj, MAGIC_ATTR, None)


def registered_methods(cls: type) -> dict[str, RegisterSpec]:
    """``{method name: spec}`` for every ``@register``-ed method of ``cls`` (inherited ones included)."""
    found = {}
    for name in dir(cls):
        # inspect.getattr_static: never trigger properties/descriptors while scanning a class.
        spec = get_register_spec(inspect.getattr_static(cls, name, None))
        if spec is not None:
            found[name] = spec
    return found


# ------------------------------------------------------------------------------------------ shards
@dataclass
class _Shard:
    """One rank's view of an argument whose value is fetched or cut on the worker.

    ``mode``: ``"whole"`` = the value itself; ``"item"`` = ``value[index]``; ``"chunk"`` = the value is
    this rank's DataProto chunk, cut by the driver, whose last ``num_pad_rows`` rows are padding;
    ``"cut"`` = chunk ``index`` of the value padded to a multiple of ``num_chunks`` (cut on the worker,
    because the driver never fetched the value).
    """

    source: Any
    mode: str = "whole"
    index: int = 0
    num_chunks: int = 1
    num_pad_rows: int = 0

    def materialize(self) -> tuple[Any, tuple[int, int] | None]:
        """``(value for this rank, (rows, padding rows) if the value is a DataProto chunk else None)``."""
        value = self.source
        if isinstance(value, object_ref_types()):
            import ray

            value = ray.get(value)
        elif isinstance(value, WorkerGroupFuture):
            value = value.get()
        if self.mode == "whole":
            return value, None
        if self.mode == "item":
            return value[self.index], None
        if self.mode == "chunk":
            return value, (len(value), self.num_pad_rows)
        assert self.mode == "cut", self.mode
        if not isinstance(value, DataProto):
            raise TypeError(f"a DP_COMPUTE_PROTO argument must resolve to a DataProto, got {type(value).__name__}")
        padded, _ = pad_dataproto_to_divisor(value, self.num_chunks)
        chunk_rows = len(padded) // self.num_chunks
        real_rows = min(max(len(value) - self.index * chunk_rows, 0), chunk_rows)
        return padded.chunk(self.num_chunks)[self.index], (chunk_rows, chunk_rows - real_rows)


def _materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple[int, int] | None]:
    """Resolve shards/futures; also return ``(rows, padding rows)`` of the DataProto shards, if any."""
    rows = set()

    def resolve(value: Any) -> Any:
        if isinstance(value, _Shard):
            value, shard_rows = value.materialize()
            if shard_rows is not None:
                rows.add(shard_rows)
        elif isinstance(value, WorkerGroupFuture):
            value = value.get()
        return value

    args = tuple(resolve(a) for a in args)
    kwargs = {k: resolve(v) for k, v in kwargs.items()}
    if len(rows) > 1:
        raise ValueError(f"the DataProto arguments of one call must have the same number of rows, got "
                         f"(rows, padding rows) = {sorted(rows)} on this rank")
    return args, kwargs, (rows.pop() if rows else None)


def _drop_padding_rows(output: Any, rows: tuple[int, int], method: str) -> Any:
    """Drop the outputs of the padding rows (the last ``num_pad`` of this rank's chunk)."""
    num_rows, num_pad = rows
    if num_pad == 0 or not isinstance(output, DataProto):
        # DP_COMPUTE_METRIC and friends: outputs are not rows, nothing to drop.
        return output
    if len(output) != num_rows:
        raise ValueError(
            f"{method} returned {len(output)} rows for an input chunk of {num_rows} rows ({num_pad} of them "
            f"padding); padding can only be removed when the output has one row per input row. Make the "
            f"batch size divisible by the number of workers, or return one row per input row")
    return unpad_dataproto(output, num_pad)


# --------------------------------------------------------------------------------- dispatch fns
PerRank = list[tuple[tuple, dict]]


def _broadcast(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    args = tuple(_Shard(a) if isinstance(a, WorkerGroupFuture) else a for a in args)
    kwargs = {k: (_Shard(v) if isinstance(v, WorkerGroupFuture) else v) for k, v in kwargs.items()}
    return [(args, kwargs)] * world_size


def _scatter(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    def item(value: Any, rank: int) -> Any:
        if isinstance(value, WorkerGroupFuture):
            return value.rank_ref(rank) if value.is_per_rank(world_size) else _Shard(value, "item", rank)
        return value[rank]

    return [(tuple(item(a, r) for a in args), {k: item(v, r) for k, v in kwargs.items()})
            for r in range(world_size)]


def _is_per_rank_arg(value: Any, world_size: int) -> bool:
    if isinstance(value, WorkerGroupFuture):
        return value.is_per_rank(world_size)
    return isinstance(value, (list, tuple)) and len(value) == world_size


def dispatch_one_to_all(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    return _broadcast(world_size, args, kwargs)


def dispatch_all_to_all(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    values = list(args) + list(kwargs.values())
    if values and all(_is_per_rank_arg(v, world_size) for v in values):
        return _scatter(world_size, args, kwargs)
    return _broadcast(world_size, args, kwargs)


def dispatch_dp_compute(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    for name, value in list(enumerate(args)) + list(kwargs.items()):
        if not (isinstance(value, WorkerGroupFuture) or _is_per_rank_arg(value, world_size)):
            raise ValueError(f"DP_COMPUTE argument {name!r} must be a list/tuple with one entry per worker "
                             f"({world_size}), got {type(value).__name__}"
                             + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else ""))
    return _scatter(world_size, args, kwargs)


def dispatch_dp_compute_proto(world_size: int, args: tuple, kwargs: dict) -> PerRank:
    named = list(enumerate(args)) + list(kwargs.items())
    lengths = {name: len(v) for name, v in named if isinstance(v, DataProto)}
    for name, value in named:
        if not isinstance(value, (DataProto, WorkerGroupFuture, *object_ref_types())):
            raise TypeError(f"DP_COMPUTE_PROTO argument {name!r} must be a DataProto (or a future of one), "
                            f"got {type(value).__name__}; pass other values in meta_info")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"DP_COMPUTE_PROTO arguments must have the same number of rows, got {lengths}")
    per_arg = {name: _split_proto(value, world_size) for name, value in named}
    return [(tuple(per_arg[i][r] for i in range(len(args))), {k: per_arg[k][r] for k in kwargs})
            for r in range(world_size)]


def _split_proto(value: Any, world_size: int) -> list[_Shard]:
    if not isinstance(value, DataProto):
        # A future: the worker fetches it and cuts its own chunk (the driver does not know its length).
        return [_Shard(value, "cut", r, world_size) for r in range(world_size)]
    padded, pad_size = pad_dataproto_to_divisor(value, world_size)
    chunks = padded.chunk(world_size)
    chunk_rows = len(padded) // world_size
    shards = []
    for r, chunk in enumerate(chunks):
        real_rows = min(max(len(value) - r * chunk_rows, 0), chunk_rows)
        shards.append(_Shard(chunk, "chunk", num_pad_rows=chunk_rows - real_rows))
    assert sum(s.num_pad_rows for s in shards) == pad_size
    return shards


# ---------------------------------------------------------------------------------- collect fns
def collect_list(outputs: list) -> list:
    return list(outputs)


def collect_first(outputs: list) -> Any:
    return outputs[0]


def collect_dp_compute_proto(outputs: list) -> DataProto:
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(f"a DP_COMPUTE_PROTO method must return a DataProto, rank {rank} returned "
                            f"{type(out).__name__}; register it with Dispatch.DP_COMPUTE_METRIC to get a list")
    return DataProto.concat(outputs)


DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, tuple[Callable[[int, tuple, dict], PerRank], Callable[[list], Any]]] = {
    Dispatch.ONE_TO_ALL: (dispatch_one_to_all, collect_list),
    Dispatch.ALL_TO_ALL: (dispatch_all_to_all, collect_list),
    Dispatch.RANK_ZERO: (dispatch_one_to_all, collect_first),
    Dispatch.DP_COMPUTE: (dispatch_dp_compute, collect_list),
    Dispatch.DP_COMPUTE_PROTO: (dispatch_dp_compute_proto, collect_dp_compute_proto),
    Dispatch.DP_COMPUTE_METRIC: (dispatch_dp_compute_proto, collect_list),
}
"""``{Dispatch: (dispatch_fn(world_size, args, kwargs) -> per-rank (args, kwargs), collect_fn(outputs))}``."""
