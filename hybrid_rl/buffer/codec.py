"""Every string and number of an experience stored as it was given, on every SQL database.

What databases refuse or change, and what this module writes instead (``CODEC_VERSION`` 1, recorded
per row in the ``codec`` column; a row without it was written before and is read as stored):

* **NUL in text** (``"\\x00"``: SmolLM2's token 190 decodes to it): PostgreSQL's ``text`` and
  ``json`` functions refuse it. Text columns and every string inside JSON (keys too) escape it with
  the private-use character U+E000: ``"\\x00"`` -> ``"\\ue0000"``, U+E000 itself -> ``"\\ue000e"``, and
  a lone surrogate (no UTF-8 form; a broken decode can give one) -> ``"\\ue000u"`` + 4 hex digits.
  Text without these characters is stored unchanged (readable and queryable as it is).
* **NaN, +inf, -inf inside JSON** (log-probs, ``extra``): JSON has no such numbers and PostgreSQL
  refuses Python's ``NaN`` token. They are written as the tagged object ``{"$float": "nan"}``
  (``"inf"``, ``"-inf"``); a user's own one-key dict whose key is ``$float`` or ``$dict`` is wrapped
  as ``{"$dict": {...}}``, so no value is ever mistaken for a tag.
* **NaN in a float column** (``reward``, ``created_at``): SQLite stores a NaN REAL as NULL. The
  columns stay plain floats (the reward stays queryable: ``WHERE reward > 0``); NULL reads back as
  NaN (these fields are never None). PostgreSQL stores NaN and both infinities natively, SQLite
  the infinities.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

__all__ = ["CODEC_VERSION", "decode_float", "decode_json", "decode_text", "encode_json", "encode_text"]

CODEC_VERSION = 1
"""The ``codec`` of rows this module writes; None (the column's NULL) = a row written before it."""

_ESC = "\ue000"
_NEEDS_ESCAPE = re.compile("[\x00\ue000\ud800-\udfff]")
_ESCAPED = re.compile("\ue000(0|e|u[0-9a-f]{4})")
_FLOAT_TAG, _DICT_TAG = "$float", "$dict"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _escape(match: re.Match) -> str:
    char = match[0]
    if char == "\x00":
        return _ESC + "0"
    if char == _ESC:
        return _ESC + "e"
    return f"{_ESC}u{ord(char):04x}"  # a lone surrogate


def _unescape(match: re.Match) -> str:
    code = match[1]
    if code == "0":
        return "\x00"
    if code == "e":
        return _ESC
    return chr(int(code[1:], 16))


def encode_text(text: str) -> str:
    """``text`` as a database accepts it (see the module docstring); unchanged when it holds no NUL,
    U+E000 or lone surrogate."""
    return _NEEDS_ESCAPE.sub(_escape, text)


def decode_text(text: Optional[str]) -> Optional[str]:
    """The inverse of :func:`encode_text`."""
    return _ESCAPED.sub(_unescape, text) if text and _ESC in text else text


def _plain_number(value: Any) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def encode_json(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, str, int, float, bool, None) with non-finite floats tagged
    and strings escaped, so that strict JSON (PostgreSQL's) holds it; tuples become lists."""
    if isinstance(value, str):
        return encode_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_TAG: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, (list, tuple)):
        if all(_plain_number(v) for v in value):  # token ids, finite log-probs: the common case
            return list(value)
        return [encode_json(v) for v in value]
    if isinstance(value, dict):
        encoded = {encode_text(k) if isinstance(k, str) else k: encode_json(v) for k, v in value.items()}
        if len(value) == 1 and next(iter(value)) in (_FLOAT_TAG, _DICT_TAG):
            return {_DICT_TAG: encoded}
        return encoded
    return value


def decode_json(value: Any) -> Any:
    """The inverse of :func:`encode_json`."""
    if isinstance(value, str):
        return decode_text(value)
    if isinstance(value, list):
        if all(_plain_number(v) for v in value):
            return value
        return [decode_json(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == _FLOAT_TAG and inner in _NON_FINITE:
                return _NON_FINITE[inner]
            if key == _DICT_TAG and isinstance(inner, dict):
                return {decode_text(k): decode_json(v) for k, v in inner.items()}
        return {decode_text(k): decode_json(v) for k, v in value.items()}
    return value


def decode_float(value: Optional[float]) -> float:
    """A float column's value: NULL (SQLite's NaN) reads as NaN."""
    return math.nan if value is None else float(value)
