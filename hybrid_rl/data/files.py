"""Data files as public dumps ship them: which files a path names, and their rows as plain dicts.

A data path is a file, a folder (its data files, sorted by name, as the Hub's ``data/`` folders of
parquet shards) or a glob (``data/train-*.parquet``). A file is ``.parquet``, ``.jsonl``, ``.json`` (a
JSON array of objects, an object holding one such array, a column-wise object of equal-length lists, or
JSON Lines under a ``.json`` name, as ``datasets.Dataset.to_json`` writes) or one of the JSON forms
gzipped (``.jsonl.gz``, ``.json.gz``: HH-RLHF's own files). Every failure is a ``ValueError`` naming
the file and the fix.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["SUPPORTED_SUFFIXES", "data_suffix", "expand_data_files", "iter_rows", "read_rows"]

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
_FIX = "check data.train_files / data.val_files"


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


def _open_text(path: Path) -> io.TextIOBase:
    if data_suffix(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl_rows(lines: Iterable[str], path: Path) -> Iterator[dict[str, Any]]:
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"data file {str(path)!r} line {line_no}: invalid JSON ({err}); fix or remove the line") from None
        if not isinstance(row, dict):
            raise ValueError(f"data file {str(path)!r} line {line_no}: expected a JSON object per line, "
                             f"got {type(row).__name__}")
        yield row


def _json_document_rows(value: Any, path: Path) -> list[dict[str, Any]]:
    """Rows of one parsed JSON document: an array of objects, ``{"<name>": [objects]}``, or columns."""
    if isinstance(value, dict):
        arrays = [v for v in value.values() if isinstance(v, list)]
        if len(value) == 1 and arrays and all(isinstance(r, dict) for r in arrays[0]):
            value = arrays[0]  # {"data": [...]}
        elif value and len(arrays) == len(value) and len({len(a) for a in arrays}) == 1:
            names = list(value)
            value = [dict(zip(names, cells)) for cells in zip(*arrays)]  # column-wise
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise ValueError(f"data file {str(path)!r}: expected a JSON array of row objects (or JSON Lines), got a "
                         f"{type(value).__name__}; write the rows as [{{...}}, ...] or one object per line")
    return value


def _json_rows(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(path) as f:
        start = f.read(4096).lstrip()
        f.seek(0)
        if start.startswith("["):
            yield from _json_document_rows(json.load(f), path)
            return
        first = f.readline()
        try:  # one object on the first line, more after it: JSON Lines under a .json name
            json.loads(first)
            one_per_line = bool(f.readline().strip())
        except json.JSONDecodeError:
            one_per_line = False
        f.seek(0)
        if one_per_line:
            yield from _jsonl_rows(f, path)
        else:
            try:
                document = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"data file {str(path)!r}: invalid JSON ({err}); fix the file") from None
            yield from _json_document_rows(document, path)


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types (ArrowInvalid, OSError, ...)
        raise ValueError(f"data file {str(path)!r} is not a readable parquet file: {err}. Fix: re-write it with "
                         "pandas.DataFrame.to_parquet / pyarrow, or give the rows as a .jsonl file") from err
    for batch in parquet.iter_batches(batch_size=8192):  # plain lists/dicts (pandas would give numpy arrays)
        yield from batch.to_pylist()


def _rows_of(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist (or is not a file); {_FIX}")
    suffix = data_suffix(path)
    if suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"data file {str(path)!r} has unsupported suffix {suffix!r}; supported: "
                         f"{', '.join(SUPPORTED_SUFFIXES)} (or a folder / glob of them)")
    if suffix == ".parquet":
        return _parquet_rows(path)
    return _jsonl_file_rows(path) if suffix.startswith(".jsonl") else _json_rows(path)


def _jsonl_file_rows(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(path) as f:
        yield from _jsonl_rows(f, path)


def iter_rows(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The rows of one data file, one plain dict at a time (nested lists/dicts, no numpy), so that a
    loader keeps only what it makes of them; a missing, empty, unreadable or unsupported file is a
    ValueError naming it."""
    count = 0
    try:
        for row in _rows_of(Path(path)):
            count += 1
            yield row
    except (OSError, UnicodeDecodeError, EOFError) as err:  # a cut gzip stream, bad bytes
        raise ValueError(f"data file {os.fspath(path)!r} could not be read: {err}; fix or re-download it") from err
    if not count:
        raise ValueError(f"data file {os.fspath(path)!r} contains no rows; fill it or remove it from "
                         "data.train_files / data.val_files")


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of one data file (:func:`iter_rows`)."""
    return list(iter_rows(path))
