"""Rollout and validation dumps: veRL's per-step JSONL of decoded rows, and our sidecar beside it.

``trainer.rollout_data_dir`` / ``trainer.validation_data_dir`` (veRL's keys) name a folder that gets,
per step, ``{global_step}.jsonl``: one JSON object per row with veRL's keys in veRL's order::

    {"input": <decoded prompt>, "output": <decoded response>, "gts": <ground truth>,
     "score": <the row's reward>, "step": <global step>, <the scorer's extra keys>...}

(a scorer's extra key named like one of veRL's replaces it, as in veRL; validation rows carry
veRL's ``reward`` too). What veRL does not keep goes into ``{global_step}.sidecar.jsonl``, one line
per row in the same order (:func:`sidecar_rows`): the prompt and response token ids, the response
mask, the per-token rollout (behaviour) and training log-probs, reference log-probs, values and
advantages where the batch has them, the policy version, the prompt group's ``uid``, the turns
(runs of the response mask: model tokens 1, tool and environment observations 0) and a multi-turn
row's agent columns. ``trainer.dump_max_rows_per_step`` keeps a step's first rows only and
``trainer.dump_gzip`` writes ``.jsonl.gz``. ``trainer.dump_replay_batch`` adds, for replay, each
step's whole batch (``{global_step}.batch.pt``, every row whatever the row limit) and the run's
``meta.json`` (:mod:`hybrid_rl.trainer.core.batch_file`). Files are created 0600.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.run_checks import unwritable
from hybrid_rl.trainer.core import batch_file

__all__ = ["DUMP_DIR_KEYS", "DumpPart", "StepDumps", "build_dumps", "dump_folder_problems", "dump_paths",
           "sidecar_rows", "training_part", "verl_rows"]

logger = logging.getLogger(__name__)

DUMP_DIR_KEYS = ("rollout_data_dir", "validation_data_dir")
"""The ``trainer.*`` keys naming a dump folder (veRL's names)."""

TOKEN_KEYS = ("rollout_log_probs", "old_log_probs", "ref_log_prob", "values", "advantages", "returns",
              "rollout_is_weights", "rollout_versions", "entropys")
"""Per-token batch keys ([B, R]) the sidecar keeps, over the row's valid response tokens."""

ROW_KEYS = ("uid", "data_source", "policy_version", "min_global_steps", "max_global_steps", "num_turns",
            "tool_rewards", "turn_scores", "agent_metrics", "agent_failure", "rollout_row", "rollout_rows")
"""Per-row non-tensor columns the sidecar keeps where the batch has them."""

EXTRA_PREFIX = "reward_extra_"
"""Training batches hold the scorer's extra keys as ``reward_extra_<key>`` columns (compute_reward)."""


@dataclass
class DumpPart:
    """One batch of rows of a step's dump and what scored them."""

    batch: DataProto
    """Rows after generation: ``prompts``, ``responses``, ``attention_mask``, ``response_mask`` [B, *]."""
    scores: Sequence[float]
    """Each row's reward (veRL's ``score``), [B]."""
    extras: dict[str, Sequence[Any]]
    """The scorer's extra keys, one value per row (a key whose column is not B long is left out, as veRL does)."""


def dump_paths(folder: str, step: int, compress: bool) -> tuple[str, str]:
    """``(veRL's file, the sidecar)`` of ``step`` in ``folder``."""
    suffix = ".jsonl.gz" if compress else ".jsonl"
    return os.path.join(folder, f"{step}{suffix}"), os.path.join(folder, f"{step}.sidecar{suffix}")


def dump_folder_problems(trainer_cfg: Any) -> list[str]:
    """One line per dump folder key whose folder cannot be created or written."""
    problems = []
    for key in DUMP_DIR_KEYS:
        value = getattr(trainer_cfg, key)
        if value is None:
            continue
        why = "it is empty" if not str(value).strip() else unwritable(os.path.abspath(str(value)))
        if why is not None:
            problems.append(f"trainer.{key}={value!r} cannot hold the dumps: {why}. Fix: point trainer.{key} at a "
                            "folder you can write (it is created if missing), or set it to null (no dump).")
    return problems


class StepDumps:
    """Writes one step's rows into ``folder`` (veRL's JSONL and the sidecar)."""

    def __init__(self, folder: str, tokenizer: Any, max_rows: Optional[int] = None, compress: bool = False,
                 replay_batch: bool = False):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.folder, self.tokenizer, self.max_rows, self.compress = folder, tokenizer, max_rows, compress
        self.replay_batch = replay_batch  # also {step}.batch.pt: every row of the parts, for replay

    def write(self, step: int, parts: Sequence[DumpPart]) -> tuple[str, str]:
        """Dump ``parts`` (in order, cut at ``max_rows``) as step ``step``; returns the two paths."""
        verl, side = [], []
        budget = self.max_rows if self.max_rows is not None else sum(len(p.batch) for p in parts)
        for part in parts:
            rows = min(len(part.batch), budget - len(verl))
            if rows <= 0:
                break
            verl += verl_rows(part, self.tokenizer, step, rows)
            side += sidecar_rows(part.batch, step, rows, self.tokenizer, start=len(side))
        paths = dump_paths(self.folder, step, self.compress)
        for path, lines in zip(paths, (verl, side)):
            _write_private(path, lines, self.compress)
        if self.replay_batch:  # never cut by max_rows: replay needs the batch the update consumed
            whole = parts[0].batch if len(parts) == 1 else DataProto.concat([p.batch for p in parts])
            batch_file.save_batch(batch_file.batch_path(self.folder, step), whole)
        logger.debug("dumped %d rows of step %d to %s", len(verl), step, paths[0])
        return paths


def build_dumps(trainer_cfg: Any, tokenizer: Any, config: Any = None,
                device: Optional[str] = None) -> tuple[Optional[StepDumps], Optional[StepDumps]]:
    """``(training dumps, validation dumps)`` from ``trainer.*`` (None where the key is null); one
    ValueError naming every bad folder first. With ``trainer.dump_replay_batch`` the training dumps
    write each step's batch too, and ``meta.json`` is written now from ``config`` (the run's whole
    typed config) and ``device`` (where the run computes)."""
    problems = dump_folder_problems(trainer_cfg)
    if problems:
        raise ValueError(" ".join(problems))
    made = []
    for key in DUMP_DIR_KEYS:
        folder = getattr(trainer_cfg, key)
        replay = key == "rollout_data_dir" and trainer_cfg.dump_replay_batch
        made.append(None if folder is None else StepDumps(
            str(folder), tokenizer, trainer_cfg.dump_max_rows_per_step, trainer_cfg.dump_gzip, replay_batch=replay))
    if made[0] is not None and made[0].replay_batch and config is not None:
        from hybrid_rl.trainer.config.loader import to_container

        batch_file.write_meta(made[0].folder, to_container(config), device or str(trainer_cfg.device))
        batch_file.write_pointer(str(trainer_cfg.default_local_dir), made[0].folder)  # replay RUN_DIR finds them
    return made[0], made[1]


def training_part(batch: DataProto) -> DumpPart:
    """A training batch as a dump: ``score`` = ``token_level_scores`` summed over the row (the
    reward before any in-reward KL, veRL's choice), extras from the ``reward_extra_*`` columns."""
    scores = batch.batch["token_level_scores"].sum(-1).tolist()  # [B]
    extras = {key[len(EXTRA_PREFIX):]: column for key, column in batch.non_tensor_batch.items()
              if key.startswith(EXTRA_PREFIX)}
    return DumpPart(batch, scores, extras)


# ---------------------------------------------------------------------- rows
def _valid(batch: DataProto, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prompt_valid [rows, P], response_valid [rows, R])``: the real (attended) tokens."""
    width = batch.batch["prompts"].shape[-1]
    attention = batch.batch["attention_mask"][:rows].bool().numpy()
    return attention[:, :width], attention[:, width:]


def verl_rows(part: DumpPart, tokenizer: Any, step: int, rows: int) -> list[dict[str, Any]]:
    """veRL's line of each of the first ``rows`` rows: ``input``/``output`` decoded without special
    tokens (every real response token: a multi-turn response shows its observations too)."""
    batch = part.batch
    prompt_valid, response_valid = _valid(batch, rows)
    prompts, responses = batch.batch["prompts"][:rows].numpy(), batch.batch["responses"][:rows].numpy()
    inputs = tokenizer.batch_decode([p[v].tolist() for p, v in zip(prompts, prompt_valid)], skip_special_tokens=True)
    outputs = tokenizer.batch_decode([r[v].tolist() for r, v in zip(responses, response_valid)],
                                     skip_special_tokens=True)
    truths = batch.non_tensor_batch.get("reward_model")
    extras = {key: list(column) for key, column in part.extras.items() if np.ndim(column) >= 1
              and len(column) == len(batch)}
    lines = []
    for i in range(rows):
        truth = truths[i].get("ground_truth") if truths is not None and isinstance(truths[i], dict) else None
        line = {"input": inputs[i], "output": outputs[i], "gts": truth, "score": float(part.scores[i]), "step": step}
        line.update({key: column[i] for key, column in extras.items()})
        lines.append(line)
    return lines


def sidecar_rows(batch: DataProto, step: int, rows: int, tokenizer: Any = None, start: int = 0) -> list[dict[str, Any]]:
    """Our line of each of the first ``rows`` rows (``row``: its position in the step's dump, from
    ``start``). Per-token lists cover the row's real response tokens, so ``response_ids``,
    ``response_mask`` and every :data:`TOKEN_KEYS` list have one length; ``turns`` are the runs of
    ``response_mask`` over them (``mask`` 0: a tool or environment observation), with their decoded
    ``text`` for a row of more than one turn."""
    prompt_valid, response_valid = _valid(batch, rows)
    prompts, responses = batch.batch["prompts"][:rows].numpy(), batch.batch["responses"][:rows].numpy()
    mask = batch.batch["response_mask"][:rows].numpy()
    tokens = {key: batch.batch[key][:rows].float().numpy() if batch.batch[key].is_floating_point()
              else batch.batch[key][:rows].numpy() for key in TOKEN_KEYS if key in batch.batch.keys()}
    columns = {key: batch.non_tensor_batch[key] for key in ROW_KEYS if key in batch.non_tensor_batch}
    lines = []
    for i in range(rows):
        valid = response_valid[i]
        ids, row_mask = responses[i][valid], mask[i][valid].astype(np.int64)
        line: dict[str, Any] = {"row": start + i, "step": step,
                                "prompt_ids": prompts[i][prompt_valid[i]].tolist(), "response_ids": ids.tolist(),
                                "response_mask": row_mask.tolist()}
        line.update({key: values[i][valid].tolist() for key, values in tokens.items()})
        line.update({key: column[i] for key, column in columns.items()})
        if "policy_version" not in columns:  # the colocated mode samples with the weights of the previous step
            line["policy_version"] = step - 1
        line["turns"] = _turns(row_mask, ids, tokenizer)
        lines.append(line)
    return lines


def _turns(mask: np.ndarray, ids: np.ndarray, tokenizer: Any) -> list[dict[str, Any]]:
    """Runs of equal ``mask`` values: ``{"start", "end" (exclusive), "mask"}`` (+ ``text`` when more than one)."""
    if len(mask) == 0:
        return []
    edges = np.flatnonzero(np.diff(mask)) + 1
    starts, ends = np.concatenate([[0], edges]), np.concatenate([edges, [len(mask)]])
    turns = [{"start": int(s), "end": int(e), "mask": int(mask[s])} for s, e in zip(starts, ends)]
    if len(turns) > 1 and tokenizer is not None:
        texts = tokenizer.batch_decode([ids[t["start"]:t["end"]].tolist() for t in turns], skip_special_tokens=False)
        for turn, text in zip(turns, texts):
            turn["text"] = text
    return turns


# ---------------------------------------------------------------------- files
def _write_private(path: str, lines: list[dict[str, Any]], compress: bool) -> None:
    """Write ``lines`` as JSONL to ``path``, created 0600 (replacing a file of an earlier run)."""
    text = "".join(json.dumps(line, ensure_ascii=False, default=batch_file.plain_json) + "\n" for line in lines)
    text = text.encode("utf-8")
    if compress:
        text = gzip.compress(text, compresslevel=6, mtime=0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
    with os.fdopen(fd, "wb") as f:
        f.write(text)
