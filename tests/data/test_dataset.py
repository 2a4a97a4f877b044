"""RLHFDataset + collate_fn: exact ids, padding, truncation, filtering, row validation."""

import logging
import re

import numpy as np
import pytest
import torch
from data_helpers import IM_END, IM_START, byte_ids, chatml_ids, make_row, write_jsonl, write_parquet

from hybrid_rl.data import RLHFDataset, collate_fn, truncate_ids
from hybrid_rl.utils.testing import build_byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def test_item_has_exact_chat_template_ids_parquet_and_jsonl(tmp_path, tok):
    rows = [make_row("hi", truth="7", source="src", index=5, split="train")]
    for path in (write_parquet(rows, tmp_path / "a.parquet"), write_jsonl(rows, tmp_path / "a.jsonl")):
        item = RLHFDataset(path, tok)[0]
        assert item["input_ids"].tolist() == chatml_ids("hi")
        assert item["input_ids"].dtype == torch.int64 and item["input_ids"].dim() == 1
        assert item["attention_mask"].tolist() == [1] * len(chatml_ids("hi"))
        assert item["raw_prompt"] == [{"role": "user", "content": "hi"}]
        assert item["data_source"] == "src"
        assert item["reward_model"] == {"style": "rule", "ground_truth": "7"}
        assert item["extra_info"] == {"index": 5, "split": "train"}
        assert item["index"] == 5 and item["ability"] == "math"
        assert "uid" not in item


def test_multi_file_concat_and_default_index(tmp_path, tok):
    a = write_jsonl([make_row("a"), make_row("b")], tmp_path / "a.jsonl")
    b = write_parquet([make_row("c")], tmp_path / "b.parquet")
    ds = RLHFDataset([a, b], tok, return_raw_chat=False)
    assert len(ds) == 3
    assert [ds[i]["index"] for i in range(3)] == [0, 1, 2]  # no extra_info.index -> global position
    assert ds[2]["input_ids"].tolist() == chatml_ids("c")
    assert "raw_prompt" not in ds[0]


def test_items_are_copies_of_the_cache(tmp_path, tok):
    ds = RLHFDataset(write_jsonl([make_row("x", truth="3")], tmp_path / "a.jsonl"), tok)
    item = ds[0]
    item["reward_model"]["ground_truth"] = "changed"
    item["raw_prompt"][0]["content"] = "changed"
    item["input_ids"][0] = 99
    again = ds[0]
    assert again["reward_model"]["ground_truth"] == "3"
    assert again["raw_prompt"][0]["content"] == "x" and again["input_ids"][0] == IM_START


def test_collate_left_pads_and_builds_position_ids(tmp_path, tok):
    ds = RLHFDataset(write_jsonl([make_row("abcd"), make_row("a")], tmp_path / "a.jsonl"), tok)
    batch = ds.collate_fn([ds[0], ds[1]])
    long_ids, short_ids = chatml_ids("abcd"), chatml_ids("a")
    P, gap = len(long_ids), len(long_ids) - len(short_ids)
    assert gap == 3
    assert batch["input_ids"].tolist() == [long_ids, [0] * gap + short_ids]
    assert batch["attention_mask"].tolist() == [[1] * P, [0] * gap + [1] * (P - gap)]
    assert batch["position_ids"].tolist() == [list(range(P)), [0] * gap + list(range(P - gap))]
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].dtype == torch.int64 and batch[key].shape == (2, P)
    # Equal-length message lists must stay a 1-D object array, not a [2, 1] array of dicts.
    for key in ("raw_prompt", "reward_model", "extra_info", "data_source", "index", "ability"):
        assert batch[key].shape == (2,) and batch[key].dtype == object, key
    assert batch["raw_prompt"][1] == [{"role": "user", "content": "a"}]
    assert batch["reward_model"][0] == {"style": "rule", "ground_truth": "1"}


def test_collate_uses_given_pad_id_and_rejects_bad_batches():
    items = [{"input_ids": torch.tensor([5, 6, 7]), "attention_mask": torch.ones(3, dtype=torch.int64), "k": [1, 2]},
             {"input_ids": torch.tensor([8]), "attention_mask": torch.ones(1, dtype=torch.int64), "k": [3, 4]}]
    batch = collate_fn(items, pad_token_id=9)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [9, 9, 8]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch["k"].shape == (2,) and batch["k"][1] == [3, 4]
    with pytest.raises(ValueError, match="empty batch"):
        collate_fn([])
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_fn([items[0], {"input_ids": torch.tensor([1]), "attention_mask": torch.ones(1)}])


def test_collate_output_feeds_dataproto(tmp_path, tok):
    protocol = pytest.importorskip("hybrid_rl.protocol")
    ds = RLHFDataset(write_jsonl([make_row("abc"), make_row("a")], tmp_path / "a.jsonl"), tok)
    data = protocol.DataProto.from_single_dict(ds.collate_fn([ds[0], ds[1]]))
    assert len(data) == 2
    assert data.batch["input_ids"].shape == (2, len(chatml_ids("abc")))
    assert data.non_tensor_batch["raw_prompt"].shape == (2,)
    assert data[1].non_tensor_batch["reward_model"]["ground_truth"] == "1"


def test_pad_id_falls_back_to_eos(tmp_path, tok):
    no_pad = build_byte_tokenizer()
    no_pad.pad_token = None
    ds = RLHFDataset(write_jsonl([make_row("abc"), make_row("a")], tmp_path / "a.jsonl"), no_pad)
    assert ds.pad_token_id == IM_END
    assert ds.collate_fn([ds[0], ds[1]])["input_ids"][1, 0].item() == IM_END


@pytest.mark.parametrize("mode,expected", [
    ("left", [6, 7, 8, 9]), ("right", [0, 1, 2, 3]), ("middle", [0, 1, 8, 9]),
])
def test_truncate_ids_modes(mode, expected):
    assert truncate_ids(range(10), 4, mode) == expected
    assert truncate_ids(range(3), 4, mode) == [0, 1, 2]


def test_truncate_middle_odd_and_error_mode():
    assert truncate_ids(range(10), 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_ids(range(10), 1, "middle") == [9]
    with pytest.raises(ValueError, match="cannot cut"):
        truncate_ids(range(10), 4, "error")


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_dataset_truncates_overlong_rows(tmp_path, tok, mode):
    path = write_jsonl([make_row("abcdefghijklmnop"), make_row("a")], tmp_path / "a.jsonl")
    full = chatml_ids("abcdefghijklmnop")
    max_len = len(chatml_ids("a")) + 2
    ds = RLHFDataset(path, tok, max_prompt_length=max_len, filter_overlong_prompts=False, truncation=mode)
    assert len(ds) == 2
    assert ds[0]["input_ids"].tolist() == truncate_ids(full, max_len, mode)
    assert ds[1]["input_ids"].tolist() == chatml_ids("a")  # short rows untouched


def test_truncation_error_names_file_and_row(tmp_path, tok):
    path = write_jsonl([make_row("a"), make_row("a much longer prompt than the first")], tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match=r"a\.jsonl' row 2: prompt is \d+ tokens.*max_prompt_length=20"):
        RLHFDataset(path, tok, max_prompt_length=20, filter_overlong_prompts=False, truncation="error")


def test_filter_overlong_drops_and_logs(tmp_path, tok, caplog):
    rows = [make_row("a", truth="0"), make_row("x" * 50, truth="1"), make_row("bb", truth="2")]
    path = write_parquet(rows, tmp_path / "a.parquet")
    with caplog.at_level(logging.INFO, logger="hybrid_rl.data.dataset"):
        ds = RLHFDataset(path, tok, max_prompt_length=len(chatml_ids("bb")))
    assert [ds[i]["reward_model"]["ground_truth"] for i in range(len(ds))] == ["0", "2"]
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 2]
    assert "filtered 1 of 3 prompts" in caplog.text
    assert ds.prompt_lengths().tolist() == [len(chatml_ids("a")), len(chatml_ids("bb"))]


def test_filter_dropping_everything_is_an_error(tmp_path, tok):
    path = write_jsonl([make_row("abc"), make_row("abcdef")], tmp_path / "a.jsonl")
    longest = len(chatml_ids("abcdef"))
    with pytest.raises(ValueError, match=rf"max_prompt_length=5 .*longest {longest}"):
        RLHFDataset(path, tok, max_prompt_length=5)


def test_max_samples_is_a_seeded_ordered_subset(tmp_path, tok):
    path = write_jsonl([make_row(str(i), index=i) for i in range(20)], tmp_path / "a.jsonl")
    pick = lambda seed: [item["index"] for item in RLHFDataset(path, tok, max_samples=5, seed=seed)]  # noqa: E731
    a, b, c = pick(3), pick(3), pick(4)
    assert a == b and len(a) == 5 and a == sorted(a) and len(set(a)) == 5
    assert a != c
    assert len(RLHFDataset(path, tok, max_samples=50)) == 20


def test_no_chat_template_error_and_plain_text_mode(tmp_path, tok):
    plain = build_byte_tokenizer()
    plain.chat_template = None
    path = write_jsonl([{**make_row("x"), "prompt": [{"role": "system", "content": "sys"},
                                                      {"role": "user", "content": "q"}]}], tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match="no chat_template.*apply_chat_template=False"):
        RLHFDataset(path, plain)
    ds = RLHFDataset(path, plain, apply_chat_template=False)
    assert ds[0]["input_ids"].tolist() == byte_ids("sys\nq")


def _bad(row, **changes):
    row = dict(row)
    for key, value in changes.items():
        if value is KeyError:
            row.pop(key)
        else:
            row[key] = value
    return row


GOOD = make_row("ok")
MALFORMED = [
    (_bad(GOOD, prompt=KeyError), "'prompt' is missing"),
    (_bad(GOOD, prompt=[]), "'prompt' is an empty message list"),
    (_bad(GOOD, prompt="just a string"), "'prompt' must be a list of chat messages, got str"),
    (_bad(GOOD, prompt=[{"role": "user"}]), r"'prompt\[0\]\.content' must be a string"),
    (_bad(GOOD, prompt=["hi"]), r"'prompt\[0\]' must be a dict"),
    (_bad(GOOD, data_source=KeyError), "'data_source' is missing"),
    (_bad(GOOD, data_source=""), "'data_source' must be a non-empty string"),
    (_bad(GOOD, reward_model=KeyError), "'reward_model' is missing"),
    (_bad(GOOD, reward_model="7"), "'reward_model' must be a dict"),
    (_bad(GOOD, reward_model={"style": "rule"}), "'reward_model.ground_truth' is missing"),
    (_bad(GOOD, extra_info=[1]), "'extra_info' must be a dict"),
    (_bad(GOOD, ability=3), "'ability' must be a string"),
    (_bad(GOOD, prompt=[{"role": "user", "content": " "}]), "'prompt' has no text"),
]


@pytest.mark.parametrize("row,message", MALFORMED)
def test_malformed_row_names_file_row_and_field(tmp_path, tok, row, message):
    path = write_jsonl([GOOD, GOOD, row], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=re.escape(path) + r"' row 3: field " + message):
        RLHFDataset(path, tok)


def test_missing_column_is_named_for_the_file(tmp_path, tok):
    rows = [{k: v for k, v in GOOD.items() if k != "data_source"}] * 2
    path = write_parquet(rows, tmp_path / "cols.parquet")
    with pytest.raises(ValueError, match=r"cols\.parquet' has no column 'data_source' \(its columns: \["):
        RLHFDataset(path, tok)
    with pytest.raises(ValueError, match=r"no column 'messages'.*set data\.prompt_key"):
        RLHFDataset(write_jsonl([GOOD], tmp_path / "good.jsonl"), tok, prompt_key="messages")


def test_malformed_parquet_row(tmp_path, tok):
    rows = [GOOD, {**GOOD, "reward_model": {"style": "rule", "ground_truth": None}}]
    path = write_parquet(rows, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet' row 2: field 'reward_model\.ground_truth' is missing"):
        RLHFDataset(path, tok)


def test_bad_files_are_named(tmp_path, tok):
    with pytest.raises(ValueError, match=r"nope\.parquet' does not exist"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tok)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl' contains no rows"):
        RLHFDataset(str(tmp_path / "empty.jsonl"), tok)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"junk\.parquet' is not a readable parquet file"):
        RLHFDataset(str(tmp_path / "junk.parquet"), tok)
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"rows\.csv' has unsupported suffix '\.csv'"):
        RLHFDataset(str(tmp_path / "rows.csv"), tok)
    path = write_jsonl([GOOD, "{not json"], tmp_path / "broken.jsonl")
    with pytest.raises(ValueError, match=r"broken\.jsonl' line 2: invalid JSON"):
        RLHFDataset(path, tok)
    path = write_jsonl(["[1, 2]"], tmp_path / "list.jsonl")
    with pytest.raises(ValueError, match=r"list\.jsonl' line 1: expected a JSON object"):
        RLHFDataset(path, tok)
    with pytest.raises(ValueError, match="data_files is empty"):
        RLHFDataset([], tok)


@pytest.mark.parametrize("kwargs,message", [
    ({"truncation": "both"}, "truncation='both' is not valid"),
    ({"max_prompt_length": 0}, "max_prompt_length=0"),
    ({"max_samples": 0}, "max_samples=0"),
])
def test_bad_arguments(tmp_path, tok, kwargs, message):
    path = write_jsonl([GOOD], tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match=re.escape(message)):
        RLHFDataset(path, tok, **kwargs)


def test_prompt_key_and_numeric_ground_truth(tmp_path, tok):
    row = {"data_source": "s", "question": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": 4}}
    ds = RLHFDataset(write_jsonl([row], tmp_path / "a.jsonl"), tok, prompt_key="question")
    item = ds[0]
    assert item["raw_prompt"] == [{"role": "user", "content": "q"}]
    assert item["reward_model"]["ground_truth"] == 4
    assert item["extra_info"] == {} and item["ability"] == "unknown"
    assert np.array_equal(item["input_ids"].numpy(), np.array(chatml_ids("q")))


def test_tool_schemas_reach_the_chat_template_and_agent_name_is_kept(tmp_path):
    tok = build_byte_tokenizer()
    tok.chat_template = ("{% if tools %}{{ 'TOOLS ' + (tools | map(attribute='function') | map(attribute='name') "
                         "| join(',')) + '\\n' }}{% endif %}" + tok.chat_template)
    rows = [make_row("hi"), {**make_row("ho"), "agent_name": "tool_agent"}]
    path = write_jsonl(rows, tmp_path / "a.jsonl")
    schema = {"type": "function", "function": {"name": "calculator"}}
    with_tools = RLHFDataset(path, tok, tools=[schema])
    assert tok.decode(with_tools[0]["input_ids"]).startswith("TOOLS calculator\n")
    assert not tok.decode(RLHFDataset(path, tok)[0]["input_ids"]).startswith("TOOLS")
    # agent_name is on every item once some row has it (mixed rows still collate)
    batch = collate_fn([with_tools[0], with_tools[1]])
    assert list(batch["agent_name"]) == [None, "tool_agent"]
