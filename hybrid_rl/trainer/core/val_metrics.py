"""veRL's best-of / worst-of / majority-vote validation metrics over the n samples of each prompt.

For each data source and each numeric variable of the samples (``reward``: the row's score; every
numeric key a scorer returns beside ``score``, e.g. ``acc``), per prompt (all but ``mean@n`` over the
prompts that got more than one sample; veRL's ``process_validation_metrics``, same names):

- ``mean@n`` (of the variables other than the reward, whose ``mean@n`` and ``pass@k`` are
  :func:`hybrid_rl.trainer.core.validation.summarize`'s, over every prompt) and ``std@n``: the
  average and the spread of a prompt's n values;
- ``best@k/mean``, ``best@k/std`` (and ``worst@k/...``): the best (worst) of k samples drawn with
  replacement from the prompt's n, for k = 2, 4, ... < n and n. veRL estimates these from 1,000
  seeded bootstrap draws; here they are the exact expectation and standard deviation of that draw
  (the bootstrap's limit), from the sorted values;
- ``maj@k/mean``, ``maj@k/std``: the value of the majority answer among k drawn samples, when the
  scorer returns its extracted answer as ``pred`` (ties go to the answer drawn first, whose first
  drawn sample gives the value, as veRL). This one is a seeded bootstrap like veRL's (1,000 draws,
  seed 42, vectorised with numpy's ``default_rng``: the same estimate, not veRL's digits).

Each metric is averaged over the prompts of a data source. Keys: ``val-core/<source>/<var>/<metric>``
for the core variable (per source: ``acc`` when its scorer gives it, else ``reward``) at the largest
k (``mean@n``, ``best@n/...``, ``maj@n/...``, as veRL), ``val-aux/...`` for the rest.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional, Sequence

import numpy as np

from hybrid_rl.reward.guard import finite_float

BOOTSTRAP_DRAWS = 1000
"""Bootstrap draws per prompt and k for ``maj@k`` (veRL's ``n_bootstrap``)."""
BOOTSTRAP_SEED = 42
"""veRL's seed of the ``maj@k`` bootstrap."""


def draw_sizes(n: int, start: int = 2) -> list[int]:
    """k values for n samples: ``start``, twice that, ... below n, and n (veRL's from 2; pass@k's from 1)."""
    ks, k = [], start
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def best_worst_of(values: Sequence[float], k: int) -> tuple[float, float, float, float]:
    """``(best mean, best std, worst mean, worst std)`` of k draws with replacement from ``values``.

    With the n values sorted ascending, the largest of k draws is the i-th (1-based) with probability
    ``(i/n)^k - ((i-1)/n)^k`` and the smallest with ``((n-i+1)/n)^k - ((n-i)/n)^k`` (ties share a value,
    so they need no care)."""
    v = np.sort(np.asarray(values, dtype=np.float64))  # [n]
    n = len(v)
    i = np.arange(1, n + 1, dtype=np.float64)
    p_max = (i / n) ** k - ((i - 1) / n) ** k  # [n]
    p_min = ((n - i + 1) / n) ** k - ((n - i) / n) ** k  # [n]
    return (*_mean_std(v, p_max), *_mean_std(v, p_min))


def _mean_std(values: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    mean = float(probs @ values)
    return mean, float(np.sqrt(max(float(probs @ (values - mean) ** 2), 0.0)))


def majority_of(values: Sequence[float], preds: Sequence[Any], k: int,
                draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """``(mean, std)`` over ``draws`` seeded bootstrap draws of k samples of the majority answer's
    value: the answer drawn most often (ties: the one drawn first) and the value of its first draw."""
    codes = _answer_ids(preds)  # [n]
    vals = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(vals), size=(draws, k))  # [D, k]
    drawn = codes[idx]  # [D, k]
    answers = int(codes.max()) + 1
    counts = np.zeros((draws, answers), dtype=np.int64)
    np.add.at(counts, (np.arange(draws)[:, None], drawn), 1)  # [D, A]
    first = np.full((draws, answers), k, dtype=np.int64)
    np.minimum.at(first, (np.arange(draws)[:, None], drawn), np.broadcast_to(np.arange(k), (draws, k)))
    # most draws first, then the earliest first draw: counts * (k + 1) - first is unique per row's maximum
    winner = np.argmax(counts * (k + 1) - first, axis=1)  # [D]
    chosen = vals[idx[np.arange(draws), first[np.arange(draws), winner]]]  # [D]
    return float(chosen.mean()), float(chosen.std())


def _answer_ids(preds: Sequence[Any]) -> np.ndarray:
    """One integer per distinct answer, equal answers alike as a dict keys them in veRL (``1`` and
    ``1.0`` vote together; an unhashable answer by its ``repr``)."""
    ids: dict[Any, int] = {}
    out = []
    for p in preds:
        try:
            hash(p)
        except TypeError:
            p = repr(p)
        out.append(ids.setdefault(p, len(ids)))
    return np.asarray(out, dtype=np.int64)


def prompt_metrics(values: Sequence[float], preds: Optional[Sequence[Any]]) -> dict[str, float]:
    """veRL's per-prompt metrics of one variable's n > 1 values (and answers, for ``maj@k``)."""
    n = len(values)
    metrics = {f"std@{n}": float(np.std(np.asarray(values, dtype=np.float64)))}
    for k in draw_sizes(n):
        best_mean, best_std, worst_mean, worst_std = best_worst_of(values, k)
        metrics.update({f"best@{k}/mean": best_mean, f"best@{k}/std": best_std,
                        f"worst@{k}/mean": worst_mean, f"worst@{k}/std": worst_std})
        if preds is not None:
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = majority_of(values, preds, k)
    return metrics


def sample_metrics(data_sources: Sequence[str], uids: Sequence[str], variables: dict[str, list[Any]],
                   preds: Optional[Sequence[Any]] = None) -> dict[str, float]:
    """The metrics above under their ``val-core`` / ``val-aux`` keys. ``variables``: name -> one value
    per sample. A sample without a number (a failed or timed-out row: no extra keys) counts 0 when the
    variable has a number anywhere in its source, as its reward does and as pass@k counts it
    unsolved; a source with none has no such variable. ``preds``: one answer per sample (``None``, no
    answer, votes like any other, as in veRL; a prompt whose answers are all ``None`` gets no vote),
    or None (no ``maj@k``)."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    largest: dict[str, int] = defaultdict(int)  # the most samples a prompt of the source got
    for i, key in enumerate(zip(data_sources, uids)):
        groups[key].append(i)
    for (source, _), rows in groups.items():
        largest[source] = max(largest[source], len(rows))
    present = {(source, name) for name, column in variables.items()  # a number somewhere in the source
               for source, value in zip(data_sources, column) if finite_float(value) is not None}
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (source, _), rows in groups.items():
        answers = None if preds is None else [preds[i] for i in rows]
        if answers is not None and all(a is None for a in answers):
            answers = None  # this source's scorer gives no answers: no vote
        for name, column in variables.items():
            if (source, name) not in present:
                continue
            values = [finite_float(column[i]) or 0.0 for i in rows]
            if name != "reward":  # the reward's mean@n is validation.summarize's (every prompt)
                sums[(source, name, f"mean@{len(values)}")].append(float(np.mean(values)))
            if len(values) > 1:
                for metric, value in prompt_metrics(values, answers).items():
                    sums[(source, name, metric)].append(value)
    # veRL: per source, acc is the headline variable when the source's scorer gives it
    with_acc = {source for source, name, _ in sums if name == "acc"}
    out = {}
    for (source, name, metric), per_prompt in sums.items():
        k, core = largest[source], "acc" if source in with_acc else "reward"
        headline = name == core and metric.split("/")[0] in (f"mean@{k}", f"best@{k}", f"maj@{k}")
        out[f"{'val-core' if headline else 'val-aux'}/{source}/{name}/{metric}"] = float(np.mean(per_prompt))
    return out
