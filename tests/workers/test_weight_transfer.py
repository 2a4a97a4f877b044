"""The non-pickling weight transfer (hybrid_rl.workers.weight_transfer) without Ray or an engine:
bucket layout, tied weights written once, the handle is small plain data, the segments' lifecycle,
the driver's ledger and the errors a user gets."""

import os
import pickle
import stat
import subprocess
import sys

import pytest
import torch

from hybrid_rl.utils.testing import tiny_llama_config
from hybrid_rl.workers.weight_transfer import (SEGMENT_PREFIX, PushLedger, TensorEntry, WeightExporter, WeightHandle,
                                               alias_groups, choose_transport, open_weights, sweep_dead_segments)
from hybrid_rl.workers.weight_transfer.export import _ALIGN


@pytest.fixture
def shm_dir(tmp_path):
    return str(tmp_path)  # a private directory: the tests never race other processes' segments


def _segments(directory):
    return sorted(f for f in os.listdir(directory) if f.startswith(SEGMENT_PREFIX))


def _mixed_tensors():
    gen = torch.Generator().manual_seed(0)
    return [("a.fp32", torch.randn(5, 3, generator=gen)),
            ("b.bf16", torch.randn(7, generator=gen).to(torch.bfloat16)),
            ("c.int64", torch.arange(6).reshape(2, 3)),
            ("d.scalar", torch.tensor(3.5)),
            ("e.empty", torch.empty(0, 4)),
            ("f.large", torch.randn(64, generator=gen)),  # 256 B: larger than a bucket, gets its own
            ("g.noncontig", torch.randn(4, 6, generator=gen).t())]


def test_round_trip_is_bit_exact_across_buckets_and_dtypes(shm_dir):
    source = _mixed_tensors()
    exporter = WeightExporter(shm_dir)
    handle = exporter.export(iter(source), {}, "shm", bucket_bytes=128)
    assert len(handle.buckets) >= 3 and max(handle.bucket_sizes) == 256  # f.large alone in its bucket
    assert all(e.offset % _ALIGN == 0 for e in handle.entries)
    with open_weights(handle) as named:
        loaded = [(name, tensor.clone()) for name, tensor in named]
    assert [n for n, _ in loaded] == [n for n, _ in source]
    for (_, got), (_, want) in zip(loaded, source):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    exporter.close()


def test_tied_weights_are_written_once_and_mapped_under_every_name(shm_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_llama_config(tie_word_embeddings=True))
    assert alias_groups(model) == {"lm_head.weight": "model.embed_tokens.weight"}
    state = model.state_dict()
    unique_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() dedupes
    handle = WeightExporter(shm_dir).export(iter(state.items()), alias_groups(model), "shm", bucket_bytes=1 << 20)
    assert handle.num_bytes == unique_bytes
    assert len(state) == len(handle.entries) + 1  # one entry for the two tied names
    written = sum(handle.bucket_sizes)
    padding = sum(-(-e.nbytes // _ALIGN) * _ALIGN - e.nbytes for e in handle.entries)
    assert unique_bytes <= written <= unique_bytes + padding
    with open_weights(handle) as named:
        for name, tensor in named:
            assert torch.equal(tensor, state[name]), name
    assert handle.order == tuple(state)


def _walk(value):
    yield value
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, (WeightHandle, TensorEntry)):
        for item in vars(value).values():
            yield from _walk(item)


def test_the_handle_is_small_plain_data(shm_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_llama_config())
    handle = WeightExporter(shm_dir).export(iter(model.state_dict().items()), {}, "shm")
    parts = list(_walk(handle))
    assert not any(isinstance(p, torch.Tensor) for p in parts)
    assert {type(p) for p in parts} <= {WeightHandle, TensorEntry, tuple, str, int, type(None)}
    assert len(pickle.dumps(handle)) < 4096  # vs ~1.2 MB of pickled tensors for this model


def test_segments_are_private_and_released_or_closed(shm_dir):
    exporter = WeightExporter(shm_dir)
    first = exporter.export(iter(_mixed_tensors()), {}, "shm", bucket_bytes=128)
    second = exporter.export(iter(_mixed_tensors()), {}, "shm", bucket_bytes=1 << 20)
    for path in first.buckets + second.buckets:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert exporter.live_pushes == [first.push_id, second.push_id]
    assert exporter.release(first) == len(first.buckets)
    assert exporter.release(first) == 0  # twice is harmless
    assert not any(os.path.exists(p) for p in first.buckets) and all(os.path.exists(p) for p in second.buckets)
    with pytest.raises(ValueError, match="is gone"):
        with open_weights(first):
            pass
    exporter.close()
    assert _segments(shm_dir) == [] and exporter.live_pushes == []


def test_released_segments_are_renamed_and_written_again(shm_dir):
    exporter = WeightExporter(shm_dir)
    source = _mixed_tensors()
    first = exporter.export(iter(source), {}, "shm", bucket_bytes=1 << 20)
    inode = os.stat(first.buckets[0]).st_ino
    exporter.release(first)
    assert len(_segments(shm_dir)) == 1 and not os.path.exists(first.buckets[0])  # one spare, new name
    doubled = [(n, t * 2) for n, t in source]
    second = exporter.export(iter(doubled), {}, "shm", bucket_bytes=1 << 20)
    assert os.stat(second.buckets[0]).st_ino == inode  # the same pages
    with open_weights(second) as named:
        assert all(torch.equal(t, w) for (_, t), (_, w) in zip(named, doubled))
    exporter.release(second)
    exporter.close()
    assert _segments(shm_dir) == []


def test_a_failed_export_leaves_no_segment(shm_dir):
    def stream():
        yield "a", torch.ones(4)
        raise RuntimeError("gather failed")

    with pytest.raises(RuntimeError, match="gather failed"):
        WeightExporter(shm_dir).export(stream(), {}, "shm", bucket_bytes=8)
    assert _segments(shm_dir) == []


def test_sweep_removes_only_dead_processes_segments(shm_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for name in (f"{SEGMENT_PREFIX}{dead}_0", f"{SEGMENT_PREFIX}{os.getpid()}_99", "other_file"):
        open(os.path.join(shm_dir, name), "w").close()
    assert sweep_dead_segments(shm_dir) == 1
    assert sorted(os.listdir(shm_dir)) == sorted([f"{SEGMENT_PREFIX}{os.getpid()}_99", "other_file"])
    open(os.path.join(shm_dir, f"{SEGMENT_PREFIX}{dead}_1"), "w").close()
    WeightExporter(shm_dir)  # an exporter sweeps when it starts
    assert f"{SEGMENT_PREFIX}{dead}_1" not in os.listdir(shm_dir)


def test_bad_inputs_get_one_line_fixes(shm_dir, monkeypatch):
    exporter = WeightExporter(shm_dir)
    with pytest.raises(ValueError, match="transport 'nccl' is not one of"):
        exporter.export(iter([]), {}, "nccl")
    with pytest.raises(ValueError, match=r"bucket_bytes \(0\) must be positive"):
        exporter.export(iter([]), {}, "shm", bucket_bytes=0)
    with pytest.raises(ValueError, match="expected a WeightHandle"):
        with open_weights([("a", torch.ones(1))]):
            pass
    with pytest.raises(ValueError, match="does not exist"):
        WeightExporter(os.path.join(shm_dir, "missing")).export(iter([("a", torch.ones(1))]), {}, "shm")
    handle = exporter.export(iter([("a", torch.ones(1))]), {}, "shm")
    import hybrid_rl.workers.weight_transfer.load as load

    monkeypatch.setattr(load, "node_address", lambda: "10.0.0.2")
    remote = WeightHandle(handle.push_id, "shm", handle.buckets, handle.bucket_sizes, handle.entries, "10.0.0.1")
    with pytest.raises(ValueError, match="on host 10.0.0.1 but this rollout worker runs on host 10.0.0.2"):
        with open_weights(remote):
            pass
    with pytest.raises(ValueError, match="transport 'gloo' is not one of"):
        choose_transport("n", ["n"], "gloo")


def test_choose_transport():
    assert choose_transport("a", ["a", "a"]) == "shm"
    assert choose_transport("a", ["a", "b"]) == "object_store"
    assert choose_transport("a", [None]) == "shm"  # unknown: the reader checks the node id itself
    assert choose_transport("a", ["a"], "object_store") == "object_store"


def test_ledger_frees_loaded_and_replaced_pushes():
    freed = []
    ledger = PushLedger(lambda h: freed.append(h.push_id))
    handles = [WeightHandle(i, "shm", (), (), ()) for i in range(3)]
    for h in handles:
        ledger.offered(h)
    ledger.loaded(handles[1])  # push 0 was replaced before it was loaded: freed with 1
    assert freed == [0, 1] and ledger.pending == [2]
    ledger.release_all()
    assert freed == [0, 1, 2] and ledger.pending == []


def test_a_lora_actor_s_tied_weights_are_found_under_the_merged_names(shm_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from hybrid_rl.workers.lora import LORA_ADAPTER, merged_lora_weights
    from hybrid_rl.workers.weight_transfer import rollout_aliases

    model = AutoModelForCausalLM.from_config(tiny_llama_config(tie_word_embeddings=True))
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]), adapter_name=LORA_ADAPTER)
    aliases = rollout_aliases(peft_model)
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    merged = list(merged_lora_weights(iter(peft_model.state_dict().items()), peft_model))
    handle = WeightExporter(shm_dir).export(iter(merged), aliases, "shm")
    assert len(handle.entries) == len(merged) - 1
    with open_weights(handle) as named:
        assert all(torch.equal(t, dict(merged)[n]) for n, t in named)


def test_ledger_teardown_never_masks_a_failure(caplog):
    class DeadFuture:
        def get(self):
            raise RuntimeError("trainer rank 0 died")

    calls = []

    def release(handle):
        calls.append(handle.push_id)
        if handle.push_id == 1:
            raise RuntimeError("group is shut down")
        return DeadFuture()

    ledger = PushLedger(release)
    for i in range(2):
        ledger.offered(WeightHandle(i, "shm", (), (), ()))
    ledger.release_all()  # logs, does not raise
    assert calls == [0, 1] and ledger.pending == []
    assert "could not be released" in caplog.text
