"""Lines and files that cannot be read: invalid JSON, bytes that are not UTF-8, a value that is not an
object, blank lines, mixed arrays, a corrupt gzip or parquet. Each stops the default load in one line
naming the file and the line (rows and lines are numbered from 1, a JSON Lines row by its line), and
``data.bad_rows=skip`` leaves unreadable lines out of every loader, reported as other bad rows are."""

import gzip
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid_rl.data.bad_rows import BadRows
from hybrid_rl.data.files import iter_records, read_rows
from hybrid_rl.data.preference import load_preference_pairs
from hybrid_rl.data.sft import load_sft_examples
from hybrid_rl.utils.testing import build_byte_tokenizer

INVALID_JSON = b"{oops"
NOT_UTF8 = b'{"data_source": "\xff"}'  # 0xff is byte 18 of the line: 17 bytes before it
NOT_AN_OBJECT = b"[1, 2]"
BAD_LINES = {
    "invalid JSON": (INVALID_JSON, "invalid JSON (Expecting property name enclosed in double quotes at column 2); "
                                   "fix or remove the line"),
    "not UTF-8": (NOT_UTF8, "not UTF-8 text (byte 0xff at byte 18 of the line); re-save the file as UTF-8 or "
                            "remove the line"),
    "not a JSON object": (NOT_AN_OBJECT, "expected a JSON object per line, got list; fix or remove the line"),
}
SUMMARY_TAIL = ("(37.50%) - 1 invalid JSON, 1 not UTF-8, 1 not a JSON object. First: u.jsonl line 3: invalid JSON; "
                "u.jsonl line 4: not UTF-8; u.jsonl line 5: not a JSON object")


def _rl_row(i):
    return {"data_source": "s", "prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": str(i)}}


def _pair_row(i):
    return {"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}


def _sft_row(i):
    return {"prompt": f"q{i}", "response": f"a{i}"}


def _lines_file(path, good, bad_lines=(INVALID_JSON, NOT_UTF8, NOT_AN_OBJECT)):
    """Line 1 a good row, line 2 blank, then ``bad_lines``, then the other good rows."""
    lines = [json.dumps(good[0]).encode(), b""] + list(bad_lines) + [json.dumps(r).encode() for r in good[1:]]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.mark.parametrize("reason", list(BAD_LINES))
def test_an_unreadable_line_stops_the_default_load_naming_file_and_line(tmp_path, tok, reason):
    from hybrid_rl.data import RLHFDataset

    line, problem = BAD_LINES[reason]
    path = _lines_file(tmp_path / "u.jsonl", [_rl_row(0), _rl_row(1)], [line])
    expected = f"data file {path!r} line 3: {problem}"
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        RLHFDataset(path, tok, apply_chat_template=False)
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        load_preference_pairs(_lines_file(tmp_path / "p.jsonl", [_pair_row(0)], [line]))
    assert str(info.value) == f"data file {str(tmp_path / 'p.jsonl')!r} line 3: {problem}"


def _load(kind, path, tok):
    """Load ``path`` with ``bad_rows=skip`` as ``kind``; the number of rows kept and the policy's noun."""
    from hybrid_rl.data import RLHFDataset
    from hybrid_rl.data.reward_data import PreferenceDataset
    from hybrid_rl.data.sft import SFTDataset

    skip = {"bad_rows": "skip", "max_bad_fraction": 0.5}
    if kind == "rl":
        return len(RLHFDataset(path, tok, apply_chat_template=False, **skip)), "prompt rows"
    if kind == "pairs":
        return len(load_preference_pairs(path, **skip)), "preference pairs"
    if kind == "rm":
        return len(PreferenceDataset(path, tok, max_length=200, **skip)), "preference pairs"
    if kind == "sft":
        policy = BadRows(what="SFT rows", **{"mode": "skip", "max_fraction": 0.5})
        kept = len(load_sft_examples(path, bad_rows=policy))
        policy.finish()
        return kept, "SFT rows"
    return len(SFTDataset(path, tok, max_length=200, **skip)), "SFT rows"


@pytest.mark.parametrize("kind, make_row", [("rl", _rl_row), ("pairs", _pair_row), ("rm", _pair_row),
                                            ("sft", _sft_row), ("sft_dataset", _sft_row)])
def test_skip_leaves_unreadable_lines_out_of_every_loader(tmp_path, tok, caplog, kind, make_row):
    path = _lines_file(tmp_path / "u.jsonl", [make_row(i) for i in range(5)])  # 5 good + 3 bad, 1 blank
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.data.bad_rows"):
        kept, what = _load(kind, path, tok)
    assert kept == 5
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hybrid_rl.data.bad_rows"]
    assert line == f"data.bad_rows=skip: left out 3 of 8 {what} {SUMMARY_TAIL}"


def test_too_many_unreadable_lines_refuse_under_skip(tmp_path):
    path = _lines_file(tmp_path / "u.jsonl", [_pair_row(i) for i in range(5)])
    with pytest.raises(ValueError) as info:
        load_preference_pairs(path, bad_rows="skip")
    assert str(info.value).startswith(f"data.bad_rows=skip: left out 3 of 8 preference pairs {SUMMARY_TAIL}. That is "
                                      "more than data.max_bad_fraction=0.01")


def test_row_numbers_count_from_one_and_are_line_numbers_in_json_lines(tmp_path, tok):
    from hybrid_rl.data import RLHFDataset

    rows = [_rl_row(0), _rl_row(1), {**_rl_row(2), "prompt": []}]
    path = tmp_path / "r.jsonl"
    path.write_text("\n" + json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n" + json.dumps(rows[2]) + "\n")
    assert [n for n, _ in iter_records(path)] == [2, 4, 5]  # lines 1 and 3 are blank
    with pytest.raises(ValueError) as info:
        RLHFDataset(str(path), tok, apply_chat_template=False)
    assert str(info.value) == (f"data file {str(path)!r} row 5: field 'prompt' is an empty message list; fix or remove "
                               "the row (the row schema is in hybrid_rl/data/rows.py)")
    policy = BadRows("skip", 0.5, what="SFT rows")
    path = _lines_file(tmp_path / "s.jsonl", [_sft_row(0), {"prompt": "q"}, _sft_row(2)], [INVALID_JSON])
    assert [number for _, number, _ in load_sft_examples(path, bad_rows=policy)] == [1, 5]
    assert policy.skipped == [(path, "line 3", "invalid JSON"), (path, "row 4", "no 'response'")]


@pytest.mark.parametrize("name", ["b.jsonl", "b.json", "b.json.gz", "b.jsonl.gz"])
def test_blank_lines_in_json_lines_are_ignored(tmp_path, name):
    rows = [_rl_row(i) for i in range(3)]
    text = "\n  \n" + json.dumps(rows[0]) + "\r\n\n" + json.dumps(rows[1]) + "\n\t\n" + json.dumps(rows[2]) + "\n\n"
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    assert [(n, r) for n, r in iter_records(path)] == [(3, rows[0]), (5, rows[1]), (7, rows[2])]


def test_json_lines_under_a_json_name_with_a_broken_first_line(tmp_path):
    path = tmp_path / "l.json"
    path.write_bytes(b'{oops}\n\n' + json.dumps(_pair_row(1)).encode() + b"\n")
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert str(info.value) == (f"data file {str(path)!r} line 1: invalid JSON (Expecting property name enclosed in "
                               "double quotes at column 2); fix or remove the line")
    assert len(load_preference_pairs(str(path), bad_rows="skip", max_bad_fraction=0.5)) == 1


@pytest.mark.parametrize("wrap", [False, True])
def test_a_mixed_array_has_bad_rows_not_a_bad_file(tmp_path, caplog, wrap):
    values = [_pair_row(0), 5, _pair_row(2), "x", _pair_row(4)]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"data": values} if wrap else values))
    with pytest.raises(ValueError) as info:
        load_preference_pairs(str(path))
    assert str(info.value) == (f"data file {str(path)!r} row 2: expected a JSON object (a row), got int; fix or remove "
                               "the element")
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.data.bad_rows"):
        pairs = load_preference_pairs(str(path), bad_rows="skip", max_bad_fraction=0.5)
    assert [p.chosen for p in pairs] == ["good 0", "good 2", "good 4"]
    assert caplog.records[-1].getMessage() == (
        "data.bad_rows=skip: left out 2 of 5 preference pairs (40.00%) - 2 not a JSON object. First: m.json row 2: "
        "not a JSON object; m.json row 4: not a JSON object")


@pytest.mark.parametrize("content, message", [
    (b'[{"a": 1},\n {"b": "\xff"}]', "line 2: not UTF-8 text (byte 0xff); re-save the file as UTF-8"),
    (b'[{"a": 1},\n {"b": }]', "line 2 column 8: invalid JSON (Expecting value); fix the file, or write one row "
                               "object per line (JSON Lines)"),
    (b'"rows"', ": expected a JSON array of row objects (or JSON Lines), got a str; write the rows as [{...}, ...] "
                "or one object per line"),
])
def test_an_unreadable_json_document_is_one_line_naming_the_line(tmp_path, content, message):
    path = tmp_path / "d.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert str(info.value) == f"data file {str(path)!r}{' ' if message[0] != ':' else ''}{message}"


def _gzip_jsonl(rows=200):
    return bytearray(gzip.compress("".join(json.dumps(_pair_row(i)) + "\n" for i in range(rows)).encode(), mtime=0))


def _flipped(data, start, count):
    for i in range(start, start + count):
        data[i] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize("content, pattern", [
    (lambda: _flipped(_gzip_jsonl(), 200, 10), r"is corrupt \(CRC/zlib error\): Error -3 while decompressing data: .+"),
    (lambda: _flipped(_gzip_jsonl(), len(_gzip_jsonl()) - 8, 1),  # the CRC trailer
     r"is corrupt \(CRC/zlib error\): CRC check failed 0x[0-9a-f]+ != 0x[0-9a-f]+"),
    (lambda: b"plain text\n", r"is not a valid gzip file: Not a gzipped file \(b'pl'\)"),
    (lambda: bytes(_gzip_jsonl()[:300]), r"is cut short \(the gzip stream ends early: Compressed file ended before "
                                         r"the end-of-stream marker was reached\)"),
])
def test_a_corrupt_gzip_is_one_line_naming_the_file(tmp_path, content, pattern):
    import re

    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(content())
    for load in (read_rows, lambda p: load_preference_pairs(str(p), bad_rows="skip", max_bad_fraction=0.9)):
        with pytest.raises(ValueError) as info:
            load(path)
        assert re.fullmatch(re.escape(f"data file {str(path)!r} ") + pattern + "; re-download it or recompress it",
                            str(info.value)), str(info.value)


def test_a_corrupt_parquet_page_is_one_line_naming_the_file(tmp_path):
    import re

    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist([{"a": i, "t": f"x{i}" * 20} for i in range(20000)]), path,
                   row_group_size=10000, compression="snappy")
    path.write_bytes(_flipped(bytearray(path.read_bytes()), path.stat().st_size // 2, 8))  # in the 2nd row group
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert re.fullmatch(re.escape(f"data file {str(path)!r} is corrupt (") + r".+, after \d+ good rows\)\. Fix: re-write "
                        r"it with pandas\.DataFrame\.to_parquet / pyarrow, or give the rows as a \.jsonl file",
                        str(info.value)), str(info.value)
