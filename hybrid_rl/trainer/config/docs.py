"""The config documented from itself: each field's docstring, and the ``--help`` of every entry point.

The house writes a field's documentation as the string literal under it; Python keeps no attribute
docstrings, so they are read from the source with :mod:`ast` (:func:`field_docs`). :func:`config_help`
walks a config dataclass and prints every key with its default (as a run gets it) and its
documentation, section by section: what ``python -m hybrid_rl.trainer.main_ppo --help`` (and
``main_sft``, ``main_rm``) answer. The studio builds its form from the same docstrings.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import lru_cache
from typing import Any, Mapping, Optional

from hybrid_rl.utils.bounds import field_bounds

__all__ = ["config_help", "field_docs", "indented", "show_value"]

_WIDTH = 100


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass and its bases (the string under each field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def show_value(value: Any) -> str:
    """A default as it is written on the command line (``null``, ``true``, ``[a,b]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show_value(v) for v in value) + "]"
    return str(value)


def indented(text: str, indent: str, first: Optional[str] = None) -> list[str]:
    """``text`` re-wrapped to the help's width, each line after ``indent`` (the first after ``first``)."""
    lines = []
    for paragraph in text.split("\n\n"):
        lines += textwrap.wrap(" ".join(paragraph.split()), _WIDTH, initial_indent=first or indent,
                               subsequent_indent=indent)
    return lines


def _walk(cls: type, defaults: Mapping[str, Any], prefix: str, doc: str, out: list[str],
          notes: Mapping[str, list[str]]) -> None:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    leaves = [f for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])]
    if leaves:
        out += ["", f"[{prefix.rstrip('.') or 'top level'}]"] + (indented(doc, "  ") if doc else [])
    for f in dataclasses.fields(cls):
        key, annotation = prefix + f.name, hints[f.name]
        value = defaults.get(f.name) if isinstance(defaults, Mapping) else None
        if dataclasses.is_dataclass(annotation):
            _walk(annotation, value or {}, key + ".", docs.get(f.name, ""), out, notes)
            continue
        out.append(f"  {key}={show_value(value)}")
        out += indented(docs.get(f.name, ""), "      ")
        bounds = field_bounds(f)
        if bounds is not None:  # the range its checks enforce (hybrid_rl.utils.bounds)
            nullable = type(None) in typing.get_args(annotation)
            out.append(f"      range: {bounds.rule}{' or null' if nullable else ''}")
        for note in notes.get(key, []):
            out += indented(note, "          ", first="        - ")


def config_help(cls: type, defaults: Mapping[str, Any], usage: str, intro: Optional[str] = None,
                notes: Optional[Mapping[str, list[str]]] = None) -> str:
    """Every key of the dataclass ``cls`` with its default (``defaults``: the composed config as a
    plain dict, interpolations as written) and its documentation, grouped by section; ``notes`` adds
    lines under a key (e.g. a registry's entries)."""
    out = [usage] + ([""] + indented(intro, "") if intro else [])
    _walk(cls, defaults, "", "", out, notes or {})
    return "\n".join(out) + "\n"
