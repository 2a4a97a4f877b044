"""Data files as public dumps ship them: which files a path names, and their rows as plain dicts.

A data path is a file, a folder (its data files, sorted by name, as the Hub's ``data/`` folders of
parquet shards) or a glob (``data/train-*.parquet``). A file is ``.parquet``, ``.jsonl``, ``.json`` (a
JSON array of objects, an object holding one such array, a column-wise object of equal-length lists, or
JSON Lines under a ``.json`` name, as ``datasets.Dataset.to_json`` writes) or one of the JSON forms
gzipped (``.jsonl.gz``, ``.json.gz``: HH-RLHF's own files).

Rows are numbered from 1: in a JSON Lines file a row's number is its line number (blank lines are
ignored but counted, so ``row 18`` is what an editor shows as line 18), elsewhere its position. A line
that cannot be read (invalid JSON, bytes that are not UTF-8, a value that is not an object) and an
array element that is not an object are *bad rows* (:class:`~hybrid_rl.data.bad_rows.RowError`),
which ``data.bad_rows`` stops at or skips; a file that cannot be read at all (missing, corrupt gzip,
not parquet, an invalid JSON document) is a ``ValueError`` naming the file and the fix.
"""

from __future__ import annotations

import glob
import gzip
import itertools
import json
import os
import re
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable, Iterator, Union

from hybrid_rl.data.bad_rows import RowError

if TYPE_CHECKING:
    from hybrid_rl.data.bad_rows import BadRows

__all__ = ["SUPPORTED_SUFFIXES", "data_suffix", "expand_data_files", "iter_records", "iter_rows", "numbered_rows",
           "read_rows"]

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
_FIX = "check data.train_files / data.val_files"
_BOM = b"\xef\xbb\xbf"
_NEWLINE = re.compile(rb"\r\n|\r|\n")
_CHUNK = 1 << 16
Record = tuple[int, Union[dict[str, Any], RowError]]
"""``(row number from 1, the row or the RowError that says why it cannot be read)``."""


def data_suffix(path: str | os.PathLike) -> str:
    """The file's data suffix (``.jsonl.gz`` counts as one), or its plain suffix when unsupported."""
    name = Path(path).name.lower()
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return Path(path).suffix


def _data_files_in(folder: Path) -> list[str]:
    found = sorted(str(p) for p in folder.rglob("*") if p.is_file() and data_suffix(p) in SUPPORTED_SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not found:
        raise ValueError(f"data folder {str(folder)!r} holds no data files ({', '.join(SUPPORTED_SUFFIXES)}); {_FIX}")
    return found


def expand_data_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Every data file ``paths`` names, in order: files as given, a folder's data files (recursively,
    sorted, hidden ones left out), a glob's matches (sorted). A path naming nothing is a ValueError."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[str] = []
    for item in items:
        path = os.path.expanduser(os.fspath(item))
        if os.path.isdir(path):
            files.extend(_data_files_in(Path(path)))
        elif glob.has_magic(path):
            matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ValueError(f"data files {path!r}: the pattern matches no file; {_FIX}")
            files.extend(matches)
        else:
            files.append(path)
    return files


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if data_suffix(path).endswith(".gz") else open(path, "rb")


def _bad_line(path: Path, line_no: int, problem: str, fix: str, reason: str) -> RowError:
    return RowError(f"data file {str(path)!r} line {line_no}: {problem}; {fix}", reason, place=f"line {line_no}")


def _line_record(raw: bytes, path: Path, line_no: int) -> dict[str, Any] | RowError | None:
    """One JSON Lines line as a row, a RowError saying why it is not one, or None when blank."""
    if line_no == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return _bad_line(path, line_no, f"not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1} "
                         "of the line)", "re-save the file as UTF-8 or remove the line", "not UTF-8")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return _bad_line(path, line_no, f"invalid JSON ({err.msg} at column {err.colno})", "fix or remove the line",
                         "invalid JSON")
    if not isinstance(row, dict):
        return _bad_line(path, line_no, f"expected a JSON object per line, got {type(row).__name__}",
                         "fix or remove the line", "not a JSON object")
    return row


def _lines(f: IO[bytes], chunk_size: int = _CHUNK) -> Iterator[bytes]:
    """The lines of a binary file without their ends, split as universal newlines (``str.splitlines``
    for ``\\r\\n``, ``\\r`` and ``\\n``: old Mac files end lines with a bare ``\\r``), read
    ``chunk_size`` bytes at a time; a last line without an end counts, an empty end does not."""
    partial: list[bytes] = []  # the unfinished line's pieces
    after_cr = False  # the last chunk ended with \r: a \n opening this one ends no second line
    while chunk := f.read(chunk_size):
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        after_cr = chunk.endswith(b"\r")
        parts = _NEWLINE.split(chunk)
        partial.append(parts[0])
        if len(parts) > 1:
            yield b"".join(partial)
            yield from parts[1:-1]
            partial = [parts[-1]]
    if any(partial):
        yield b"".join(partial)


def _jsonl_records(f: IO[bytes], path: Path) -> Iterator[Record]:
    for line_no, raw in enumerate(_lines(f), start=1):
        item = _line_record(raw, path, line_no)
        if item is not None:
            yield line_no, item


def _document_values(value: Any, path: Path) -> list[Any]:
    """The row values of one parsed JSON document: an array, ``{"<name>": [rows]}``, or columns."""
    if isinstance(value, dict):
        arrays = [v for v in value.values() if isinstance(v, list)]
        if len(value) == 1 and arrays and any(isinstance(r, dict) for r in arrays[0]):
            value = arrays[0]  # {"data": [...]}
        elif value and len(arrays) == len(value) and len({len(a) for a in arrays}) == 1:
            names = list(value)
            value = [dict(zip(names, cells)) for cells in zip(*arrays)]  # column-wise
    if not isinstance(value, list):
        raise ValueError(f"data file {str(path)!r}: expected a JSON array of row objects (or JSON Lines), got a "
                         f"{type(value).__name__}; write the rows as [{{...}}, ...] or one object per line")
    return value


def _document_records(data: bytes, path: Path) -> Iterator[Record]:
    """The rows of a whole JSON document; an element that is not an object is a bad row."""
    data = data[len(_BOM):] if data.startswith(_BOM) else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = len(_NEWLINE.findall(data, 0, err.start)) + 1
        raise ValueError(f"data file {str(path)!r} line {line_no}: not UTF-8 text (byte 0x{data[err.start]:02x}); "
                         "re-save the file as UTF-8") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"data file {str(path)!r} line {err.lineno} column {err.colno}: invalid JSON ({err.msg}); "
                         "fix the file, or write one row object per line (JSON Lines)") from None
    for number, value in enumerate(_document_values(document, path), start=1):
        if isinstance(value, dict):
            yield number, value
        else:
            yield number, RowError(f"data file {str(path)!r} row {number}: expected a JSON object (a row), got "
                                   f"{type(value).__name__}; fix or remove the element", "not a JSON object")


def _is_json_lines(f: IO[bytes]) -> bool:
    """A ``.json`` file holds JSON Lines when its first non-blank line is a whole ``{...}`` and another
    non-blank line follows (a JSON document's first line is ``[``, ``{`` or an unfinished object)."""
    lines = _lines(f)
    head = next(lines, b"")
    head = head[len(_BOM):] if head.startswith(_BOM) else head  # before strip(): a BOM alone is a blank line
    non_blank = (line.strip() for line in itertools.chain([head], lines) if line.strip())
    first = next(non_blank, b"")
    return first.startswith(b"{") and first.endswith(b"}") and next(non_blank, None) is not None


def _json_records(path: Path) -> Iterator[Record]:
    with _open_binary(path) as f:
        if _is_json_lines(f):
            f.seek(0)
            yield from _jsonl_records(f, path)
            return
        f.seek(0)
        data = f.read()
    yield from _document_records(data, path)


def _jsonl_file_records(path: Path) -> Iterator[Record]:
    with _open_binary(path) as f:
        yield from _jsonl_records(f, path)


def _parquet_records(path: Path) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    fix = "re-write it with pandas.DataFrame.to_parquet / pyarrow, or give the rows as a .jsonl file"
    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types (ArrowInvalid, OSError, ...)
        raise ValueError(f"data file {str(path)!r} is not a readable parquet file: {err}. Fix: {fix}") from err
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=8192):  # plain lists/dicts (pandas would give numpy arrays)
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (OSError, pa.ArrowException) as err:  # a damaged page: the file, not one row
        detail = " ".join(str(err).split()).rstrip(".")
        raise ValueError(f"data file {str(path)!r} is corrupt ({detail}, after {number} good rows). Fix: {fix}") from err


def _records_of(path: Path) -> Iterator[Record]:
    if not path.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist (or is not a file); {_FIX}")
    suffix = data_suffix(path)
    if suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"data file {str(path)!r} has unsupported suffix {suffix!r}; supported: "
                         f"{', '.join(SUPPORTED_SUFFIXES)} (or a folder / glob of them)")
    if suffix == ".parquet":
        return _parquet_records(path)
    return _jsonl_file_records(path) if suffix.startswith(".jsonl") else _json_records(path)


def iter_records(path: str | os.PathLike) -> Iterator[Record]:
    """``(number, row)`` for every row of one data file, numbered from 1 (see the module docstring);
    ``row`` is a plain dict (nested lists/dicts, no numpy) or, for a line or element that is not a
    row, the :class:`RowError` saying why. A missing, empty, corrupt or unsupported file is a
    ValueError naming it."""
    count = 0
    where = repr(os.fspath(path))
    try:
        for record in _records_of(Path(path)):
            count += 1
            yield record
    except (zlib.error, gzip.BadGzipFile) as err:  # flipped bytes, a wrong CRC, not gzip at all
        problem = ("is not a valid gzip file" if str(err).startswith("Not a gzipped file")
                   else "is corrupt (CRC/zlib error)")
        raise ValueError(f"data file {where} {problem}: {err}; re-download it or recompress it") from err
    except EOFError as err:
        raise ValueError(f"data file {where} is cut short (the gzip stream ends early: {err}); "
                         "re-download it or recompress it") from err
    except OSError as err:
        raise ValueError(f"data file {where} could not be read: {err}; fix or re-download it") from err
    if not count:
        raise ValueError(f"data file {where} contains no rows; fill it or remove it from "
                         "data.train_files / data.val_files")


def numbered_rows(path: str | os.PathLike, bad_rows: "BadRows") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(number, row)`` for the readable rows of one data file; an unreadable one goes to ``bad_rows``
    (raised naming its file and line, or counted and left out)."""
    for number, item in iter_records(path):
        if isinstance(item, RowError):
            bad_rows.parse(path, number, _raise, item)
        else:
            yield number, item


def _raise(error: ValueError) -> None:
    raise error


def iter_rows(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The rows of one data file, one plain dict at a time, so that a loader keeps only what it makes
    of them; the first unreadable line (or non-object element) is a ValueError naming the file and line,
    as a missing, empty, corrupt or unsupported file is."""
    for _, item in iter_records(path):
        if isinstance(item, RowError):
            raise item
        yield item


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of one data file (:func:`iter_rows`)."""
    return list(iter_rows(path))
