"""Dispatch/collect of @register-ed methods, run in-process (no Ray actors): each "rank" is a ToyWorker
built with RANK/WORLD_SIZE in the environment, fed exactly what the group would send it."""

import pytest
import torch
from toy_workers import ToyWorker, make_batch

from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import Dispatch, Execute, register
from hybrid_rl.single_controller.decorator import DISPATCH_MODE_FN_REGISTRY, get_register_spec, registered_methods


def run_in_process(monkeypatch, method: str, world_size: int, *args, **kwargs):
    spec = registered_methods(ToyWorker)[method]
    dispatch_fn, collect_fn = DISPATCH_MODE_FN_REGISTRY[spec.dispatch_mode]
    outputs = []
    for rank, (rank_args, rank_kwargs) in enumerate(dispatch_fn(world_size, args, kwargs)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        outputs.append(getattr(ToyWorker(), method)(*rank_args, **rank_kwargs))
    return collect_fn(outputs)


def test_register_records_spec_and_finds_inherited_methods():
    class Child(ToyWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
        def extra(self):
            return 1

    spec = get_register_spec(Child.extra)
    assert (spec.dispatch_mode, spec.execute_mode, spec.blocking) == (Dispatch.ONE_TO_ALL, Execute.RANK_ZERO, False)
    methods = registered_methods(Child)
    assert {"extra", "double", "whoami", "die_on"} <= set(methods)
    assert methods["double"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO and methods["double"].blocking
    assert "_scaled" not in methods
    default = get_register_spec(register()(lambda self: None))
    assert (default.dispatch_mode, default.execute_mode, default.blocking) == (Dispatch.ALL_TO_ALL, Execute.ALL, True)


def test_register_rejects_bad_modes_and_async():
    with pytest.raises(TypeError, match="Dispatch member"):
        register(dispatch_mode="DP_COMPUTE_PROTO")
    with pytest.raises(TypeError, match="Execute member"):
        register(execute_mode="all")
    with pytest.raises(TypeError, match="async"):
        @register()
        async def f(self):
            return None


@pytest.mark.parametrize("num_rows,world_size", [(5, 2), (6, 2), (1, 4), (7, 3)])
def test_dp_compute_proto_pads_and_returns_rows_in_order(monkeypatch, num_rows, world_size):
    out = run_in_process(monkeypatch, "double", world_size, make_batch(num_rows))
    assert len(out) == num_rows
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(num_rows)]
    expected_x = torch.stack([torch.arange(num_rows), 10 * torch.arange(num_rows)], dim=1).float()
    torch.testing.assert_close(out.batch["y"], 2 * expected_x, rtol=0, atol=0)
    # Contiguous chunks of ceil(B/W) rows: row i went to rank i // ceil(B/W).
    chunk = -(-num_rows // world_size)
    assert out.batch["rank"].tolist() == [i // chunk for i in range(num_rows)]


def test_dp_compute_proto_shards_and_padding_counts():
    per_rank = DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO][0](2, (make_batch(5),), {})
    shards = [args[0] for args, _ in per_rank]
    assert [len(s.source) for s in shards] == [3, 3]
    assert [s.num_pad_rows for s in shards] == [0, 1]
    # The padding row repeats row 0 (pad_dataproto_to_divisor appends the leading rows).
    assert list(shards[1].source.non_tensor_batch["uid"]) == ["u3", "u4", "u0"]


def test_dp_compute_metric_returns_per_rank_outputs_with_padding_visible(monkeypatch):
    stats = run_in_process(monkeypatch, "row_stats", 2, make_batch(3))
    assert stats == [{"rank": 0, "rows": 2, "uids": ["u0", "u1"]}, {"rank": 1, "rows": 2, "uids": ["u2", "u0"]}]


def test_dp_compute_proto_merges_metrics_in_rank_order(monkeypatch):
    out = run_in_process(monkeypatch, "double", 2, make_batch(5))
    # Ranks report rows seen *before* unpadding: 3 real rows, then 2 real + 1 padding row.
    assert out.meta_info["metrics"] == {"rows_per_rank": [3, 3]}


def test_padding_with_non_row_wise_output_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="first_row_only returned 1 rows for an input chunk of 3 rows"):
        run_in_process(monkeypatch, "first_row_only", 2, make_batch(5))
    # Without padding the method is free to change the row count.
    assert len(run_in_process(monkeypatch, "first_row_only", 2, make_batch(4))) == 2


def test_dp_compute_proto_argument_errors():
    dispatch = DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO][0]
    with pytest.raises(TypeError, match="argument 'scale' must be a DataProto"):
        dispatch(2, (make_batch(4),), {"scale": 2.0})
    with pytest.raises(ValueError, match="same number of rows"):
        dispatch(2, (make_batch(4), make_batch(3)), {})


def test_one_to_all_all_to_all_dp_compute_rank_zero(monkeypatch):
    assert run_in_process(monkeypatch, "whoami", 2, "t")[1]["rank"] == 1
    # ALL_TO_ALL scatters when every argument has one entry per rank, else broadcasts.
    assert run_in_process(monkeypatch, "echo", 2, ["a", "b"], k=[1, 2]) == [
        (0, ("a",), {"k": 1}), (1, ("b",), {"k": 2})]
    assert run_in_process(monkeypatch, "echo", 2, ["a", "b"], k=3) == [
        (0, (["a", "b"],), {"k": 3}), (1, (["a", "b"],), {"k": 3})]
    assert run_in_process(monkeypatch, "echo_dp", 3, ("p", "q", "r")) == [(0, "p"), (1, "q"), (2, "r")]
    with pytest.raises(ValueError, match="one entry per worker \\(3\\), got list of length 2"):
        run_in_process(monkeypatch, "echo_dp", 3, ["p", "q"])


def test_concat_of_a_chunk_that_was_all_padding(monkeypatch):
    out = run_in_process(monkeypatch, "add_one", 4, run_in_process(monkeypatch, "double", 4, make_batch(1)))
    assert isinstance(out, DataProto) and len(out) == 1
    assert out.batch["y"].tolist() == [[1.0, 1.0]]
