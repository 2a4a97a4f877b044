"""What a loader does with a malformed row: ``data.bad_rows=error`` (the default) stops at the first
one, naming its file, row and reason; ``skip`` leaves it out, counts each reason, says so in one
summary line (the first few rows and their reasons), and refuses to start when more than
``data.max_bad_fraction`` of the rows were bad (a wrong column mapping, not a few dirty rows).

Rows are numbered from 1 (in a JSON Lines file a row's number is its line number). Loaders raise
:class:`RowError` (a ``ValueError`` with a short ``reason`` to count by) or any ``ValueError``
(counted by its first clause) for a bad row; a line that cannot be read at all (invalid JSON, not
UTF-8) is a RowError too (:func:`hybrid_rl.data.files.numbered_rows`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["BAD_ROW_MODES", "BadRows", "RowError", "bad_rows_problems"]

logger = logging.getLogger(__name__)

BAD_ROW_MODES = ("error", "skip")
SHOWN_ROWS = 3
"""How many skipped rows the summary line names."""


class RowError(ValueError):
    """A malformed row: the message says what and how to fix it; ``reason`` is short, for counting;
    ``place`` (e.g. ``line 7``) where the row is not found by its row number."""

    def __init__(self, message: str, reason: str, place: Optional[str] = None):
        super().__init__(message)
        self.reason = reason
        self.place = place


def _reason(error: ValueError) -> str:
    if isinstance(error, RowError):
        return error.reason
    text = str(error).split(". Fix")[0].split("; ")[0]
    return text if len(text) <= 80 else text[:77] + "..."


def bad_rows_problems(mode: str, max_fraction: Optional[float], prefix: str = "data") -> list[str]:
    """One line per wrong ``bad_rows`` / ``max_bad_fraction`` setting (``None``: the fraction is checked elsewhere)."""
    errors = []
    if mode not in BAD_ROW_MODES:
        errors.append(f"{prefix}.bad_rows={mode!r} must be one of {BAD_ROW_MODES}: error stops at the first bad row, "
                      "skip leaves bad rows out and reports them.")
    if max_fraction is not None and not 0 <= max_fraction < 1:
        errors.append(f"{prefix}.max_bad_fraction={max_fraction} must be in [0, 1): the most bad rows skip may leave out.")
    return errors


@dataclass
class BadRows:
    """Applies the ``data.bad_rows`` policy over one load (all its files), then :meth:`finish`."""

    mode: str = "error"
    """``error`` or ``skip`` (:data:`BAD_ROW_MODES`)."""
    max_fraction: float = 0.01
    """With ``skip``: the load fails when more than this fraction of the rows were bad."""
    what: str = "rows"
    """What the rows are, for the summary line (e.g. ``preference pairs``)."""
    seen: int = 0
    """Rows looked at."""
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    """``(file, place, reason)`` of every skipped row; ``place`` is ``row N`` (from 1) or, for a line
    that could not be read, ``line N``."""

    def __post_init__(self) -> None:
        problems = bad_rows_problems(self.mode, self.max_fraction)
        if problems:
            raise ValueError(problems[0])

    def parse(self, path: str | os.PathLike, index: int, parse: Callable[..., Any], /, *args: Any,
              again: bool = False, **kwargs: Any) -> Optional[Any]:
        """``parse(*args, **kwargs)`` for row ``index`` (numbered from 1) of ``path``; a ``ValueError``
        names the file and row (``error``) or is counted and gives None (``skip``). ``again``: a later
        stage of a row already counted (e.g. tokenizing it)."""
        self.seen += 0 if again else 1
        try:
            return parse(*args, **kwargs)
        except ValueError as error:
            where = os.fspath(path)
            if self.mode == "error":
                message = str(error)
                if where not in message:
                    message = f"{where}, row {index}: {message}"
                raise ValueError(message) from None
            self.skipped.append((where, getattr(error, "place", None) or f"row {index}", _reason(error)))
            return None

    def summary(self) -> str:
        """The one line that says what was skipped ('' when nothing was)."""
        if not self.skipped:
            return ""
        counts = Counter(reason for _, _, reason in self.skipped)
        reasons = ", ".join(f"{n} {reason}" for reason, n in counts.most_common())
        first = "; ".join(f"{os.path.basename(f)} {place}: {r}" for f, place, r in self.skipped[:SHOWN_ROWS])
        return (f"data.bad_rows=skip: left out {len(self.skipped)} of {self.seen} {self.what} "
                f"({len(self.skipped) / max(self.seen, 1):.2%}) - {reasons}. First: {first}")

    def finish(self) -> None:
        """Log the summary line; a ValueError when more than ``max_fraction`` of the rows were bad."""
        line = self.summary()
        if not line:
            return
        if len(self.skipped) > self.max_fraction * self.seen:
            raise ValueError(f"{line}. That is more than data.max_bad_fraction={self.max_fraction}: check the column "
                             "mapping (data.prompt_key, ...) or clean the files, or raise data.max_bad_fraction.")
        logger.warning(line)
