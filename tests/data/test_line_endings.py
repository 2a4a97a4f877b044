"""JSON Lines with every line ending a dump ships (``\\n``, Windows ``\\r\\n``, old Mac bare ``\\r``, mixed),
split as universal newlines and numbered by line, in chunks (memory stays flat), and a UTF-8 BOM alone on
the first line of a ``.json`` JSON-Lines file."""

import gzip
import io

import pytest

from hybrid_rl.data.files import _lines, iter_records, read_rows
from hybrid_rl.data.bad_rows import RowError

ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("name", ["r.jsonl", "r.json", "r.jsonl.gz"])
def test_each_line_ending_reads_two_rows(tmp_path, ending, name):
    data = b'{"a":1}' + ENDINGS[ending] + b'{"a":2}' + ENDINGS[ending]
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    assert read_rows(path) == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_blank_lines_count_in_the_numbers_whatever_the_ending(tmp_path, ending):
    nl = ENDINGS[ending]
    # line 1 a row, line 2 blank, line 3 a row, line 4 not JSON, line 5 a row
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a":1}' + nl + nl + b'{"a":3}' + nl + b"oops" + nl + b'{"a":5}')
    records = list(iter_records(path))
    assert [n for n, _ in records] == [1, 3, 4, 5]
    assert isinstance(records[2][1], RowError) and "line 4: invalid JSON" in str(records[2][1])
    assert [r for _, r in records if not isinstance(r, RowError)] == [{"a": 1}, {"a": 3}, {"a": 5}]


def test_mixed_endings_split_as_str_splitlines():
    text = b"a\r\nb\rc\n\r\nd\r\re"
    expected = [line.encode() for line in text.decode().splitlines()]
    assert expected == [b"a", b"b", b"c", b"", b"d", b"", b"e"]  # by hand: \r\n is one end, \r\r two
    assert list(_lines(io.BytesIO(text))) == expected


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5])
def test_a_crlf_split_across_reads_is_one_line_end(chunk_size):
    text = b"ab\r\ncd\r\rx\r\n"
    assert list(_lines(io.BytesIO(text), chunk_size)) == [b"ab", b"cd", b"", b"x"]


def test_a_bom_alone_on_the_first_line_of_a_json_lines_json_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b'\xef\xbb\xbf\n\n{"a":1}\n{"a":2}\n')
    assert list(iter_records(path)) == [(3, {"a": 1}), (4, {"a": 2})]


def test_a_bom_before_a_cr_json_lines_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a":1}\r{"a":2}\r')
    assert list(iter_records(path)) == [(1, {"a": 1}), (2, {"a": 2})]
