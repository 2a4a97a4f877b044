"""Validation: generate on the held-out prompts, score, and summarise per data source.

Metrics (veRL names): ``val-core/<data_source>/reward/mean@<n>`` (mean score of the n samples per
prompt; with greedy n=1 this is the accuracy) and ``val-core/<data_source>/reward/pass@<k>`` for
k = 1, 2, 4, ... <= n (unbiased estimator of Chen et al. 2021 from the n samples). A sample counts
as solved when the scorer reports ``acc`` truthy, or otherwise when its score is > 0 (rule-based
scorers give 0 to wrong answers). With n > 1, veRL's ``std@n``, ``best@k``, ``worst@k`` and (when
the scorer returns its answer as ``pred``) ``maj@k`` of the reward and of each numeric key the scorer
returns come too (:mod:`.val_metrics`). A few decoded samples are logged and kept in
``val_generations.jsonl`` in the run folder; with ``trainer.validation_data_dir`` every row is dumped
in veRL's layout with our sidecar (:mod:`.dumps`).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from math import comb
from typing import Any, Callable, Iterable

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation, val_metrics
from hybrid_rl.trainer.core.dumps import DumpPart, StepDumps

logger = logging.getLogger(__name__)

VAL_SAMPLES_FILE = "val_generations.jsonl"


def dataset_batches(dataset: Any, size: Any = None) -> Iterable[DataProto]:
    """``dataset`` in order, ``size`` rows a batch (None = all at once), collated by its ``collate_fn``."""
    size = size or len(dataset)
    for start in range(0, len(dataset), size):
        items = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
        yield DataProto.from_single_dict(dataset.collate_fn(items))


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - comb(num_samples - num_correct, k) / comb(num_samples, k)


def ks_for(n: int) -> list[int]:
    """k values reported for n samples per prompt: powers of two below n, and n itself."""
    return val_metrics.draw_sizes(n, start=1)


def summarize(data_sources: list[str], uids: list[str], scores: list[float], solved: list[bool], n: int) -> dict[str, float]:
    """Per-data-source mean@n and pass@k from one entry per generated sample."""
    by_source: dict[str, dict[str, list[tuple[float, bool]]]] = defaultdict(lambda: defaultdict(list))
    for source, uid, score, ok in zip(data_sources, uids, scores, solved):
        by_source[source][uid].append((score, ok))
    metrics = {}
    for source, groups in by_source.items():
        all_scores = [s for g in groups.values() for s, _ in g]
        metrics[f"val-core/{source}/reward/mean@{n}"] = float(np.mean(all_scores))
        for k in ks_for(n):
            estimates = [pass_at_k(len(g), sum(ok for _, ok in g), k) for g in groups.values() if len(g) >= k]
            if estimates:
                metrics[f"val-core/{source}/reward/pass@{k}"] = float(np.mean(estimates))
    return metrics


def agent_summary(data_sources: list[str], agent_rows: list[dict | None]) -> dict[str, float]:
    """``val-aux/<data_source>/agent/<key>``: per-source means of the multi-turn rollout's per-row
    ``agent_metrics`` (a key a row lacks counts 0: e.g. ``tool/calculator/correct`` is then the share
    of held-out rows whose trajectory used the calculator correctly)."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for source, row in zip(data_sources, agent_rows):
        if isinstance(row, dict):
            by_source[source].append(row)
    metrics = {}
    for source, rows in by_source.items():
        for key in sorted({k for r in rows for k in r}):
            metrics[f"val-aux/{source}/agent/{key}"] = float(np.mean([r.get(key, 0.0) for r in rows]))
    return metrics


def _extend_extras(extras: dict[str, list[Any]], info: dict[str, Any], before: int, rows: int) -> None:
    """Append one batch's ``reward_extra_info`` (key -> one entry per row) to ``extras``, which holds
    ``before`` samples so far; a key new in this batch is ``None`` for the earlier samples."""
    for key, column in info.items():
        if key == "reward":  # the row's reward is the score itself; a scorer's own key must not replace it
            continue
        listed = np.ndim(column) >= 1 and len(column) == rows  # a list, array or tensor column
        values = list(column) if listed else [None] * rows
        extras[key] += [None] * (before - len(extras[key])) + values


def _solved(result: dict[str, Any], scores: list[float]) -> list[bool]:
    acc = result.get("reward_extra_info", {}).get("acc")
    if acc is not None and len(acc) == len(scores):
        return [bool(a) if a is not None else False for a in acc]
    return [s > 0 for s in scores]


def _decode_valid(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> str:
    return tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)


def run_validation(
    batches: Iterable[DataProto],
    generate: Callable[[DataProto], DataProto],
    reward_fn: Callable[..., dict],
    tokenizer,
    n: int,
    step: int,
    num_logged: int = 3,
    run_dir: str | None = None,
    dumps: StepDumps | None = None,
) -> dict[str, float]:
    """Generate ``n`` responses per validation prompt with ``generate`` and score them.

    ``generate`` gets the prompt tensors (and non-tensor columns) and returns the rollout output;
    the caller sets ``meta_info`` (validate flag, seed, eos/pad ids). ``dumps``: write every row as
    step ``step`` (``trainer.validation_data_dir``).
    """
    parts: list[DumpPart] = []
    sources, uids, scores, solved, lengths, samples, agent_rows = [], [], [], [], [], [], []
    extras: dict[str, list[Any]] = defaultdict(list)  # the scorers' other keys, one entry per sample
    for b, batch in enumerate(batches):
        batch = generation.prepare_rollout_batch(batch, n, step=f"val{b}")
        gen, rest = generation.split_generation_inputs(batch)
        batch = generation.merge_generation_output(rest, generate(gen))
        result = reward_fn(batch, return_dict=True)
        row_scores = result["reward_tensor"].sum(-1).tolist()  # [B]
        sources += [str(s) for s in batch.non_tensor_batch["data_source"]]
        uids += list(batch.non_tensor_batch["uid"])
        scores += row_scores
        solved += _solved(result, row_scores)
        _extend_extras(extras, result.get("reward_extra_info", {}), len(uids) - len(row_scores), len(row_scores))
        lengths += batch.batch["response_mask"].sum(-1).tolist()
        agent_rows += list(batch.non_tensor_batch.get("agent_metrics", [None] * len(batch)))
        samples += _samples(batch, tokenizer, row_scores, num_logged - len(samples))
        if dumps is not None:  # veRL's validation rows carry the score as ``reward`` too
            info = result.get("reward_extra_info", {})
            parts.append(DumpPart(batch, row_scores, {"reward": row_scores,
                                                      **{k: v for k, v in info.items() if k != "reward"}}))
    metrics = summarize(sources, uids, scores, solved, n)
    for key in extras:
        extras[key] += [None] * (len(uids) - len(extras[key]))
    preds = extras.pop("pred", None)
    extras.pop("score", None)  # the reward above
    metrics.update(val_metrics.sample_metrics(sources, uids, {"reward": scores, **extras}, preds))
    metrics["val-aux/response_length/mean"] = float(np.mean(lengths)) if lengths else 0.0
    metrics.update(agent_summary(sources, agent_rows))
    _log_samples(samples, step, run_dir)
    if dumps is not None:
        dumps.write(step, parts)
    return metrics


def _samples(batch: DataProto, tokenizer, scores: list[float], limit: int) -> list[dict[str, Any]]:
    out = []
    prompt_width = batch.batch["prompts"].shape[-1]
    for i in range(min(max(limit, 0), len(batch))):
        prompt_mask = batch.batch["attention_mask"][i, :prompt_width]
        out.append({
            "data_source": str(batch.non_tensor_batch["data_source"][i]),
            "prompt": _decode_valid(tokenizer, batch.batch["prompts"][i], prompt_mask),
            # every valid token: a multi-turn response shows its tool results too
            "response": _decode_valid(tokenizer, batch.batch["responses"][i],
                                      batch.batch["attention_mask"][i, prompt_width:]),
            "ground_truth": _ground_truth(batch, i),
            "score": scores[i],
        })
    return out


def _ground_truth(batch: DataProto, i: int) -> Any:
    reward_model = batch.non_tensor_batch.get("reward_model")
    if reward_model is None or not isinstance(reward_model[i], dict):
        return None
    value = reward_model[i].get("ground_truth")
    return value if isinstance(value, (str, int, float)) or value is None else str(value)


def _log_samples(samples: list[dict[str, Any]], step: int, run_dir: str | None) -> None:
    for s in samples:
        logger.info("[val step %d] %r -> %r (ground truth %r, score %.3g)", step, s["prompt"], s["response"],
                    s["ground_truth"], s["score"])
    if run_dir and samples:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, VAL_SAMPLES_FILE), "a", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps({"step": step, **s}) + "\n")
