"""The trajectory viewer's reading of one dump step: veRL's ``{step}.jsonl`` beside our sidecar, row by row.

A step's two files (:mod:`hybrid_rl.trainer.core.dumps`) may be read while the run writes them: the
reader keeps the complete lines only (a gzip file cut short gives what decompresses so far), and a row
exists once both files hold its line. From the rows it builds what the page shows: per prompt group
(``uid``) each response's score, advantage, length and rollout-training log-prob gap; per response its
tokens as decoded pieces with their mask, role, log-probs, entropy and advantage, and its turns with
the tool calls a model turn makes.

A masked run (``response_mask`` 0) is an observation: ``environment`` when the chat template renders
it as a user turn (an interaction's reply), else ``tool``.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["STEP_FILE", "group_rows", "read_step", "row_detail", "row_summary", "row_uid", "step_files",
           "token_pieces"]

STEP_FILE = re.compile(r"^(\d+)\.sidecar\.jsonl(\.gz)?$")
"""A sidecar's name: ``{step}.sidecar.jsonl`` or ``.jsonl.gz``."""

_USER_TURN = re.compile(r"(<\|im_start\|>|<\|start_header_id\|>|<start_of_turn>|^)\s*user\b")
"""An observation rendered as a user turn (ChatML, Llama 3, Gemma): an interaction's reply."""

_VALUE_KEYS = {"log_prob": ("old_log_probs", "rollout_log_probs"), "rollout_log_prob": ("rollout_log_probs",),
               "old_log_prob": ("old_log_probs",), "ref_log_prob": ("ref_log_prob",), "entropy": ("entropys",),
               "advantage": ("advantages",)}
"""The per-token values a row's detail carries, each from the first sidecar key present (None if none)."""
DIGITS = 5
"""Decimals of the per-token values the token view gets."""


def step_files(folder: Path) -> dict[int, tuple[Path, Path]]:
    """``{step: (veRL's file, the sidecar)}`` of a dump folder (a step whose veRL file is absent is left out)."""
    found = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        match = STEP_FILE.match(path.name)
        if match:
            verl = folder / f"{match.group(1)}.jsonl{match.group(2) or ''}"
            if verl.is_file():
                found[int(match.group(1))] = (verl, path)
    return dict(sorted(found.items()))


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``'s complete lines; a line still being written (no newline yet, or
    not parseable) ends the list. A ``.gz`` file gives what decompresses so far. Kept per file version
    (size, modification time): the page asks for one step's groups one by one."""
    stat = path.stat()
    return _parsed(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed(path: str, size: int, mtime_ns: int) -> list[dict[str, Any]]:
    """:func:`_complete_lines` of one version of a file (callers never change what it returns)."""
    data = Path(path).read_bytes()
    if path.endswith(".gz"):
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)  # a cut stream: what it holds so far
    rows = []
    for line in data.split(b"\n")[:-1]:  # the text after the last newline is incomplete
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


def read_step(verl: Path, sidecar: Path) -> list[dict[str, Any]]:
    """The step's rows: each sidecar line with its veRL line under ``"verl"``, as far as both files
    are complete."""
    lines, extras = _complete_lines(verl), _complete_lines(sidecar)
    return [{**extra, "verl": line} for line, extra in zip(lines, extras)]


def _model_values(row: dict[str, Any], key: str) -> list[float]:
    """``row[key]`` on the model's tokens (``response_mask`` 1); [] when the row lacks it."""
    values, mask = row.get(key) or [], row.get("response_mask") or []
    return [v for v, m in zip(values, mask) if m]


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _gap(row: dict[str, Any]) -> list[Optional[float]]:
    """Per token: ``rollout_log_probs - old_log_probs`` (what rollout correction measures) on the model's
    tokens, None on observations and where either is missing."""
    rollout, old, mask = row.get("rollout_log_probs"), row.get("old_log_probs"), row.get("response_mask") or []
    if not rollout or not old:
        return [None] * len(mask)
    return [r - o if m else None for r, o, m in zip(rollout, old, mask)]


def row_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What a response's card and the sorts need: ``score``, ``advantage`` (the mean over the model's
    tokens: GRPO's one value per row), ``length`` (response tokens), ``model_tokens`` and ``mismatch``
    (the mean absolute rollout-training log-prob gap; None without both log-probs)."""
    verl, mask = row.get("verl", {}), row.get("response_mask") or []
    gaps = [abs(g) for g in _gap(row) if g is not None]
    return {"row": row.get("row"), "uid": row_uid(row), "score": verl.get("score"),
            "advantage": _mean(_model_values(row, "advantages")), "length": len(row.get("response_ids") or []),
            "model_tokens": int(sum(mask)), "mismatch": _mean(gaps), "num_turns": row.get("num_turns"),
            "observations": sum(1 for t in row.get("turns") or [] if t.get("mask") == 0),
            "policy_version": row.get("policy_version"), "output": verl.get("output", "")}


def row_uid(row: dict[str, Any]) -> str:
    """The row's prompt group: its ``uid``, else its own row (a dump without groups)."""
    uid = row.get("uid")
    return str(uid) if uid is not None else f"row-{row.get('row')}"


def group_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step's prompt groups, in dump order: ``{uid, input, gts, rows: [summaries], score_mean,
    advantage_sum, length_max, mismatch_max}``."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        summary = row_summary(row)
        group = groups.setdefault(summary["uid"], {"uid": summary["uid"], "input": row["verl"].get("input", ""),
                                                   "gts": row["verl"].get("gts"), "rows": []})
        group["rows"].append(summary)
    for group in groups.values():
        scores = [r["score"] for r in group["rows"] if isinstance(r["score"], (int, float))]
        advantages = [r["advantage"] for r in group["rows"] if r["advantage"] is not None]
        mismatches = [r["mismatch"] for r in group["rows"] if r["mismatch"] is not None]
        group.update(score_mean=_mean(scores), advantage_sum=sum(advantages) if advantages else None,
                     length_max=max(r["length"] for r in group["rows"]),
                     mismatch_max=max(mismatches) if mismatches else None)
    return list(groups.values())


def token_pieces(decode: Callable[[list[int]], str], ids: list[int]) -> list[str]:
    """Each token's text, so that the pieces join to the decoded response: a token that ends inside a
    character (byte-level BPE) gets "" and the token completing it the character (vLLM's incremental
    detokenization: decode a short window before the token, keep what the token adds)."""
    pieces, prefix, read = [], 0, 0
    for i in range(len(ids)):
        before = decode(ids[prefix:read])
        text = decode(ids[prefix:i + 1])
        # a character still open (it ends in U+FFFD) waits for its next bytes, at most 4 (UTF-8's longest)
        if len(text) > len(before) and (not text.endswith("\ufffd") or i + 1 - read >= 4):
            pieces.append(text[len(before):])
            prefix, read = read, i + 1
        else:
            pieces.append("")
    if ids and read < len(ids):  # the response ends inside a character: its last token shows what is left
        pieces[-1] = decode(ids[prefix:])[len(decode(ids[prefix:read])):]
    return pieces


def _role(turn: dict[str, Any]) -> str:
    """``model`` for a model turn; an observation's ``environment`` (rendered as a user turn) or ``tool``."""
    if turn.get("mask"):
        return "model"
    return "environment" if _USER_TURN.search(turn.get("text", "")) else "tool"


def _turns(row: dict[str, Any], pieces: Optional[list[str]], parse_calls: Callable[[str], list[Any]]
           ) -> list[dict[str, Any]]:
    """The row's turns with their ``role``, ``text`` (the dump's, else the joined pieces) and a model
    turn's parsed tool ``calls``."""
    turns = []
    for turn in row.get("turns") or []:
        text = turn.get("text")
        if text is None and pieces is not None:
            text = "".join(pieces[turn["start"]:turn["end"]])
        out = {**turn, "text": text or "", "role": _role({**turn, "text": text or ""})}
        if out["role"] == "model" and text:
            out["calls"] = [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in parse_calls(text)]
        turns.append(out)
    return turns


def row_detail(row: dict[str, Any], decode: Optional[Callable[[list[int]], str]],
               parse_calls: Callable[[str], list[Any]]) -> dict[str, Any]:
    """A response as the token view draws it: its summary, veRL's line, ``pieces`` (None without a
    tokenizer), ``ids``, ``mask``, per-token ``roles``, the per-token ``values`` (:data:`_VALUE_KEYS`
    and ``gap``; None where the dump lacks them) and ``turns``."""
    ids = row.get("response_ids") or []
    pieces = token_pieces(decode, ids) if decode is not None else None
    turns = _turns(row, pieces, parse_calls)
    roles = ["model"] * len(ids)
    for turn in turns:
        roles[turn["start"]:turn["end"]] = [turn["role"]] * (turn["end"] - turn["start"])
    values = {name: next((row[k] for k in keys if row.get(k)), None) for name, keys in _VALUE_KEYS.items()}
    gap = _gap(row)
    values["gap"] = gap if any(g is not None for g in gap) else None
    values = {name: None if column is None else [None if v is None else round(v, DIGITS) for v in column]
              for name, column in values.items()}  # what a colour and a tooltip show: a third of the bytes
    agent = {k: row[k] for k in ("num_turns", "turn_scores", "tool_rewards", "agent_metrics", "agent_failure")
             if row.get(k) is not None}
    return {**row_summary(row), "verl": row.get("verl", {}), "ids": ids, "pieces": pieces,
            "mask": row.get("response_mask") or [], "roles": roles, "values": values, "turns": turns,
            "agent": agent, "data_source": row.get("data_source")}
