"""DataProto: exact rows/order for every operation, padding, metrics merge, IO round trips."""

import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybrid_rl.protocol import (
    AUTO_PADDING_KEY,
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    collate_fn,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from hybrid_rl.protocol_utils import deep_equal, merge_metrics


def make(n: int = 4, meta: dict | None = None) -> DataProto:
    """Rows i have obs=[2i, 2i+1], val=i/10, uid='u{i}', msgs=[{'role': 'user', 'content': str(i)}]."""
    return DataProto.from_single_dict(
        {
            "obs": torch.arange(2 * n).view(n, 2),
            "val": torch.arange(n, dtype=torch.float32) / 10,
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
            "msgs": [[{"role": "user", "content": str(i)}] for i in range(n)],
        },
        meta_info=meta if meta is not None else {"temperature": 1.0},
    )


def rows(d: DataProto) -> list[int]:
    """Row ids recovered from obs[:, 0] // 2, checked consistent with every other key."""
    ids = (d.batch["obs"][:, 0] // 2).tolist()
    assert torch.equal(d.batch["obs"][:, 1], d.batch["obs"][:, 0] + 1)
    assert torch.allclose(d.batch["val"], torch.tensor(ids, dtype=torch.float32) / 10)
    assert list(d.non_tensor_batch["uid"]) == [f"u{i}" for i in ids]
    assert [m[0]["content"] for m in d.non_tensor_batch["msgs"]] == [str(i) for i in ids]
    return ids


def assert_same(a: DataProto, b: DataProto) -> None:
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert set(a.batch.keys()) == set(b.batch.keys())
        for k in a.batch.keys():
            assert deep_equal(a.batch[k], b.batch[k]), k
    assert deep_equal(a.non_tensor_batch, b.non_tensor_batch)
    assert deep_equal(a.meta_info, b.meta_info)


# ------------------------------------------------------------------------------ construction
def test_from_single_dict_splits_parts_and_lists_become_1d_object_arrays():
    d = make(3)
    assert len(d) == 3
    assert set(d.batch.keys()) == {"obs", "val"}
    assert set(d.non_tensor_batch) == {"uid", "msgs"}
    # equal-length nested lists must not become a 2-D array
    assert d.non_tensor_batch["msgs"].shape == (3,) and d.non_tensor_batch["msgs"].dtype == object
    assert rows(d) == [0, 1, 2]


def test_from_single_dict_rejects_scalars():
    with pytest.raises(ValueError, match="'x'.*int"):
        DataProto.from_single_dict({"x": 3})


def test_from_dict_mismatched_tensor_rows_names_keys():
    with pytest.raises(ValueError, match="'b' has 3 rows but 'a' has 2"):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})


def test_non_tensor_only_and_empty():
    d = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    assert d.batch is None and len(d) == 2
    assert len(DataProto()) == 0


def test_check_consistency_names_key_and_lengths():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has length 3 but batch has length 2"):
        DataProto(batch=TensorDict({"a": torch.zeros(2)}, batch_size=[2]),
                  non_tensor_batch={"uid": np.array(["a", "b", "c"], dtype=object)})
    with pytest.raises(ValueError, match=r"'y'\] has length 1 but non_tensor_batch\['x'\] has length 2"):
        DataProto(non_tensor_batch={"x": np.zeros(2), "y": np.zeros(1)})
    with pytest.raises(ValueError, match="must be a numpy array"):
        DataProto(non_tensor_batch={"x": [1, 2]})
    d = make(2)
    d.non_tensor_batch["uid"] = np.array(["a"], dtype=object)
    with pytest.raises(ValueError, match="'uid'"):
        d.check_consistency()


# ------------------------------------------------------------------------------ indexing
def test_getitem_int_returns_row_item():
    d = make(4)
    item = d[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].tolist() == [4, 5] and item.batch.batch_size == torch.Size([])
    assert item.non_tensor_batch["uid"] == "u2"
    assert item.meta_info == {"temperature": 1.0}
    assert d[-1].non_tensor_batch["uid"] == "u3"
    assert d[np.int64(1)].non_tensor_batch["uid"] == "u1"
    with pytest.raises(IndexError):
        d[4]


@pytest.mark.parametrize(
    "index, expected",
    [
        (slice(1, 3), [1, 2]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(-2, None), [3, 4]),
        ([4, 0, 0], [4, 0, 0]),
        (np.array([3, 1]), [3, 1]),
        (torch.tensor([2, 4]), [2, 4]),
        (np.array([True, False, False, True, True]), [0, 3, 4]),
        (torch.tensor([False, True, False, False, True]), [1, 4]),
        ([True, True, False, False, False], [0, 1]),
        ([], []),
    ],
)
def test_getitem_returns_dataproto_with_exact_rows(index, expected):
    d = make(5)
    out = d[index]
    assert isinstance(out, DataProto)
    assert len(out) == len(expected)
    assert rows(out) == expected
    assert out.meta_info == d.meta_info


def test_getitem_bad_mask_and_type():
    d = make(3)
    with pytest.raises(ValueError, match="bool mask has shape"):
        d[np.array([True, False])]
    with pytest.raises(TypeError):
        d["obs"]


def test_collate_fn_inverts_int_indexing():
    d = make(3)
    back = collate_fn([d[i] for i in range(3)])
    assert rows(back) == [0, 1, 2]


# ------------------------------------------------------------------------------ keys
def test_select_subsets_and_shares_without_deepcopy():
    d = make(3, meta={"a": 1, "b": [1]})
    s = d.select(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=["b"])
    assert list(s.batch.keys()) == ["obs"] and list(s.non_tensor_batch) == ["uid"] and s.meta_info == {"b": [1]}
    s.batch["obs"][0, 0] = 100
    assert d.batch["obs"][0, 0] == 100  # shared storage
    deep = d.select(meta_info_keys=["b"], deepcopy=True)
    deep.batch["obs"][0, 0] = -1
    deep.meta_info["b"].append(2)
    assert d.batch["obs"][0, 0] == 100 and d.meta_info["b"] == [1]
    assert set(d.select().batch.keys()) == {"obs", "val"}


def test_select_missing_key_is_named():
    with pytest.raises(ValueError, match="'nope' not in batch"):
        make(2).select(batch_keys=["nope"])
    with pytest.raises(ValueError, match="list of names"):
        make(2).select(batch_keys="obs")


def test_pop_removes_from_self():
    d = make(3, meta={"a": 1, "b": 2})
    popped = d.pop(batch_keys=["val"], non_tensor_batch_keys=["msgs"], meta_info_keys=["a"])
    assert list(popped.batch.keys()) == ["val"] and list(popped.non_tensor_batch) == ["msgs"]
    assert popped.meta_info == {"a": 1} and len(popped) == 3
    assert list(d.batch.keys()) == ["obs"] and list(d.non_tensor_batch) == ["uid"] and d.meta_info == {"b": 2}
    with pytest.raises(ValueError, match="'val' not in batch"):
        d.pop(batch_keys=["val"])


def test_rename_tensor_and_non_tensor_keys():
    d = make(2)
    assert d.rename(["obs", "uid"], ["input_ids", "group"]) is d
    assert set(d.batch.keys()) == {"input_ids", "val"} and set(d.non_tensor_batch) == {"group", "msgs"}
    assert d.batch["input_ids"].tolist() == [[0, 1], [2, 3]]
    d.rename("val", "value")
    assert "value" in d.batch.keys()
    with pytest.raises(ValueError, match="'value' already exists"):
        d.rename("input_ids", "value")
    with pytest.raises(ValueError, match="no such key"):
        d.rename("missing", "x")
    with pytest.raises(ValueError, match="2 old keys but 1 new"):
        d.rename(["a", "b"], ["c"])


def test_union_adds_keys_and_accepts_equal_overlap():
    a = make(3, meta={"t": 1})
    b = DataProto.from_dict({"obs": torch.arange(6).view(3, 2), "extra": torch.ones(3)},
                            {"uid": np.array(["u0", "u1", "u2"], dtype=object)}, {"t": 1, "s": 2})
    out = a.union(b)
    assert out is a
    assert set(a.batch.keys()) == {"obs", "val", "extra"} and a.meta_info == {"t": 1, "s": 2}
    # NaN in equal positions counts as equal
    x = DataProto.from_dict({"f": torch.tensor([float("nan"), 1.0])})
    x.union(DataProto.from_dict({"f": torch.tensor([float("nan"), 1.0])}))


@pytest.mark.parametrize(
    "other, part_key",
    [
        (lambda: DataProto.from_dict({"obs": torch.zeros(3, 2, dtype=torch.int64)}), r"batch\['obs'\]"),
        (lambda: DataProto.from_dict(non_tensors={"uid": ["u0", "u1", "x"]}), r"non_tensor_batch\['uid'\]"),
        (lambda: DataProto.from_dict(meta_info={"temperature": 0.5}), r"meta_info\['temperature'\]"),
    ],
)
def test_union_conflict_names_the_key(other, part_key):
    with pytest.raises(ValueError, match=f"union conflict: {part_key}"):
        make(3).union(other())


def test_union_length_mismatch():
    with pytest.raises(ValueError, match="3 and 2 rows"):
        make(3).union(make(2))


# ------------------------------------------------------------------------------ splitting
def test_chunk_equal_parts_keep_order_and_meta():
    parts = make(6).chunk(3)
    assert [rows(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert all(p.meta_info == {"temperature": 1.0} for p in parts)


def test_chunk_not_divisible_raises_with_fix():
    with pytest.raises(ValueError, match=r"5 rows into 2 equal chunks.*pad_dataproto_to_divisor"):
        make(5).chunk(2)
    with pytest.raises(ValueError, match="positive int"):
        make(4).chunk(0)


def test_chunk_with_auto_padding_flag_gives_near_equal_parts():
    d = make(5, meta={AUTO_PADDING_KEY: True})
    assert d.is_padding_enabled()
    assert [rows(p) for p in d.chunk(3)] == [[0, 1], [2, 3], [4]]
    flagged = DataProto.from_dict({"x": torch.arange(3)}, auto_padding=True)
    assert flagged.meta_info[AUTO_PADDING_KEY] is True
    assert [p.batch["x"].tolist() for p in flagged.chunk(4)] == [[0], [1], [2], []]


def test_global_auto_padding_switch(monkeypatch):
    monkeypatch.setattr(DataProtoConfig, "auto_padding", True)
    assert [len(p) for p in make(5).chunk(2)] == [3, 2]


def test_padding_method_repeats_first_or_last_row():
    d = make(3)
    d.padding(2)
    assert rows(d) == [0, 1, 2, 2, 2]
    d = make(3)
    d.padding(1, padding_candidate="first")
    assert rows(d) == [0, 1, 2, 0]


def test_split_last_part_may_be_short():
    assert [rows(p) for p in make(5).split(2)] == [[0, 1], [2, 3], [4]]


def test_pad_to_divisor_repeats_leading_rows_and_unpad_restores():
    d = make(5)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert pad == 3 and rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    back = unpad_dataproto(DataProto.concat(padded.chunk(4)), pad)
    assert_same(back, d)
    # more padding than rows cycles through the rows
    small, pad = pad_dataproto_to_divisor(make(2), 7)
    assert pad == 5 and rows(small) == [0, 1, 0, 1, 0, 1, 0]
    same, pad = pad_dataproto_to_divisor(d, 5)
    assert pad == 0 and same is d
    assert unpad_dataproto(d, 0) is d
    with pytest.raises(ValueError, match="pad_size"):
        unpad_dataproto(d, 6)


def test_concat_restores_rows_and_merges_metrics():
    a, b, c = make(6).chunk(3)
    a.meta_info = {"temperature": 1.0, "metrics": {"loss": 0.5, "lr": [1e-3, 2e-3]}}
    b.meta_info = {"temperature": 9.0, "metrics": {"loss": 0.25, "kl": 0.1}}
    c.meta_info = {"temperature": 9.0}
    out = DataProto.concat([a, b, c])
    assert rows(out) == [0, 1, 2, 3, 4, 5]
    assert out.meta_info == {"temperature": 1.0, "metrics": {"loss": [0.5, 0.25], "lr": [1e-3, 2e-3], "kl": [0.1]}}
    # metrics of the inputs are not modified
    assert a.meta_info["metrics"] == {"loss": 0.5, "lr": [1e-3, 2e-3]}


def test_concat_counts_a_shared_metrics_dict_once():
    d = make(4, meta={"metrics": {"m": 1.0}})
    out = DataProto.concat(d.chunk(2))
    assert out.meta_info["metrics"] == {"m": [1.0]}


def test_merge_metrics_is_associative():
    a, b, c = {"x": 1}, {"x": [2, 3], "y": 4}, {"y": 5}
    assert merge_metrics([merge_metrics([a, b]), c]) == merge_metrics([a, b, c]) == {"x": [1, 2, 3], "y": [4, 5]}
    with pytest.raises(ValueError, match="must be a dict"):
        merge_metrics([[1, 2]])


def test_concat_errors():
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    other = make(2)
    other.pop(batch_keys=["val"])
    with pytest.raises(ValueError, match="element 1 has keys"):
        DataProto.concat([make(2), other])


# ------------------------------------------------------------------------------ reordering
def test_repeat_interleave_and_tile():
    d = make(3)
    assert rows(d.repeat(2, interleave=True)) == [0, 0, 1, 1, 2, 2]
    assert rows(d.repeat(3, interleave=False)) == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert rows(d.repeat(1)) == [0, 1, 2]
    assert rows(d) == [0, 1, 2]  # not in place
    with pytest.raises(ValueError, match="repeat_times"):
        d.repeat(0)


def test_repeat_object_array_elements_are_the_same_objects_not_2d():
    out = make(2).repeat(2).non_tensor_batch["msgs"]
    assert out.shape == (4,) and out[0] is out[1]


def test_reorder_in_place():
    d = make(4)
    assert d.reorder(torch.tensor([3, 0, 2, 1])) is d
    assert rows(d) == [3, 0, 2, 1]
    with pytest.raises(ValueError, match="needs 4 indices"):
        d.reorder([0, 1])


def test_to_device_in_place():
    d = make(2)
    assert d.to("cpu") is d and d.batch.device == torch.device("cpu")


# ------------------------------------------------------------------------------ iterator
def test_make_iterator_sequential_without_shuffle():
    batches = list(make(6).make_iterator(mini_batch_size=2, epochs=2))
    assert [rows(b) for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    assert all(b.meta_info == {"temperature": 1.0} for b in batches)


def test_make_iterator_seeded_shuffle_is_deterministic_and_covers_each_epoch():
    d = make(8)
    first = [rows(b) for b in d.make_iterator(4, epochs=3, seed=7, shuffle=True)]
    again = [rows(b) for b in d.make_iterator(4, epochs=3, seed=7, dataloader_kwargs={"shuffle": True})]
    other = [rows(b) for b in d.make_iterator(4, epochs=3, seed=8, shuffle=True)]
    assert first == again and first != other
    for epoch in range(3):
        assert sorted(first[2 * epoch] + first[2 * epoch + 1]) == list(range(8))
    assert first[0:2] != first[2:4]  # epochs draw fresh permutations


def test_make_iterator_errors():
    with pytest.raises(ValueError, match=r"mini_batch_size \(3\).*\(8\)"):
        make(8).make_iterator(3, 1)
    with pytest.raises(ValueError, match="num_workers"):
        make(8).make_iterator(4, 1, dataloader_kwargs={"num_workers": 2})


# ------------------------------------------------------------------------------ IO
def full_batch() -> DataProto:
    return DataProto.from_single_dict(
        {
            "ids": torch.arange(6).view(3, 2),
            "f": torch.tensor([0.5, float("nan"), -1.0]),
            "bf": torch.tensor([[1.5], [2.0], [-3.25]], dtype=torch.bfloat16),
            "mask": torch.tensor([True, False, True]),
            "uid": np.array(["a", "b", "c"], dtype=object),
            "num": np.array([1.5, 2.5, 3.5]),
            "reward_model": [{"ground_truth": "4", "style": "rule"}, {"ground_truth": "5"}, {"ground_truth": None}],
            "raw_prompt": [[{"role": "user", "content": "hi"}], [], [{"role": "user", "content": "x"}]],
            "index": [np.int64(3), (1, "t"), {1: "int key"}],
        },
        meta_info={"eos_token_id": [2, 3], "temperature": 0.7, "do_sample": True,
                   "metrics": {"loss": [0.1, float("nan")]}, "shift": torch.tensor([1, 2])},
    )


def test_save_load_round_trip(tmp_path):
    d = full_batch()
    d.save_to_disk(tmp_path / "b.safetensors")
    back = DataProto.load_from_disk(tmp_path / "b.safetensors")
    assert_same(back, d)
    assert back.batch["bf"].dtype == torch.bfloat16
    assert type(back.non_tensor_batch["index"][0]) is np.int64
    assert back.non_tensor_batch["index"][1] == (1, "t")
    assert back.non_tensor_batch["index"][2] == {1: "int key"}


def test_save_load_non_tensor_only_and_slices(tmp_path):
    d = DataProto.from_dict(non_tensors={"uid": ["x"]}, meta_info={})
    d.save_to_disk(tmp_path / "a")
    assert_same(DataProto.load_from_disk(tmp_path / "a"), d)
    part = make(4)[1:3]  # views into a larger storage
    part.save_to_disk(tmp_path / "b")
    assert rows(DataProto.load_from_disk(tmp_path / "b")) == [1, 2]


def test_save_rejects_unencodable_value_naming_key(tmp_path):
    d = DataProto.from_dict(non_tensors={"obj": [object()]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['obj'\].*object"):
        d.save_to_disk(tmp_path / "x")


def test_load_rejects_foreign_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(1)}, str(tmp_path / "f"))
    with pytest.raises(ValueError, match="not a DataProto file"):
        DataProto.load_from_disk(tmp_path / "f")


def test_pickle_round_trip_equality():
    d = full_batch()
    back = pickle.loads(pickle.dumps(d))
    assert_same(back, d)
    assert back.batch["bf"].dtype == torch.bfloat16 and back.batch.batch_size == torch.Size([3])
    copied = copy.deepcopy(d)
    assert_same(copied, d)
    copied.batch["ids"][0, 0] = 99
    assert d.batch["ids"][0, 0] == 0


def test_pickle_of_slice_carries_only_its_rows():
    big = DataProto.from_dict({"x": torch.zeros(1000, 100)})
    assert len(pickle.dumps(big[:10])) < len(pickle.dumps(big)) / 50


def test_pickle_without_batch_and_grad_tensor():
    d = DataProto.from_dict(non_tensors={"uid": ["a"]}, meta_info={"k": 1})
    assert_same(pickle.loads(pickle.dumps(d)), d)
    g = DataProto.from_dict({"w": torch.ones(2, requires_grad=True)})
    assert pickle.loads(pickle.dumps(g)).batch["w"].tolist() == [1.0, 1.0]


def test_get_data_info_lists_keys():
    info = make(2).get_data_info()
    assert "batch.obs: torch.int64 (2, 2)" in info and "non_tensor_batch.uid: object (2,)" in info


def test_pickle_state_is_one_array_per_key():
    state = make(3).__getstate__()
    assert set(state["tensors"]) == {"obs", "val"}
    assert all(isinstance(arr, np.ndarray) and dtype is None for arr, dtype in state["tensors"].values())
    assert state["batch_size"] == (3,)
