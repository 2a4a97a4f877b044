"""Reward managers: a DataProto of generated responses -> ``token_level_scores`` [B, R].

Per row: decode the valid response tokens, look up ``data_source`` (``non_tensor_batch[reward_fn_key]``)
and ``reward_model["ground_truth"]``, score under the guard (:mod:`hybrid_rl.reward.guard`), and write
the score at the row's last valid response token (zeros elsewhere; a row without any valid token keeps
all zeros).

Multi-turn rows (``response_mask`` 0 on tool/interaction observations): the text scored is the whole
trajectory (model turns and observations, as veRL), and the score goes to the last *model* token
(``response_mask`` 1), because GAE carries nothing across masked positions: a score on a trailing
observation token would be lost. The rollout's ``tool_rewards``, ``turn_scores`` and ``num_turns``
columns reach the scorer in ``extra_info`` (as veRL's reward loop passes them), and with
``tool_reward_weight`` w the row's score becomes ``score + w * (sum(tool_rewards) + sum(turn_scores))``.

* ``naive`` calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)``
  once per row; ``timeout_s`` bounds each call.
* ``batch`` calls ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=,
  **reward_kwargs)`` once for all rows (e.g. a batched LLM judge); ``timeout_s`` bounds that one call
  and a failure of the call zeroes every row.

Failures never raise: they score 0.0 and are counted. The counts are in ``manager.last_metrics``
*and*, with ``return_dict=True``, under the extra key ``"reward_metrics"`` (so they also come back when
the manager runs in a remote process): ``reward/num_errors``, ``reward/num_timeouts``,
``reward/num_invalid``, ``reward/num_failed`` (their sum), ``reward/num_samples`` and
``reward/all_failed`` (1.0 when every row failed -- the trainer stops after K such steps). The first
failure of each kind is logged once per manager with its (truncated) input. A scorer's numeric dict keys
named ``reward/...`` are its own counters, summed over the rows into the same metrics (the code sandbox's
``reward/sandbox/<reason>``); they never replace the keys above.

Rows with a ``reward_score`` (an agent scored its own row; docs/agents.md) keep that score and skip
the scorer, as veRL's reward loop does with ``AgentLoopOutput.reward_score``; rows whose
``reward_model.style`` is ``agent`` are never given to the scorer (no score: 0, counted invalid).

``reward_extra_info`` holds the non-``score`` keys of dict results, one list entry per row (``None`` for
rows whose result lacked the key, e.g. failed rows), plus ``"score"`` when any such key exists (as veRL).
Configuration errors (a data source with no scorer, missing ``ground_truth``) raise ValueError.
"""

from __future__ import annotations

import abc
import logging
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.reward.guard import ScoreOutcome, finite_float, normalize_score, run_guarded, safe_score_many
from hybrid_rl.reward.registry import (check_data_sources, default_compute_score, default_compute_score_batched,
                                      thread_safe_sources)
from hybrid_rl.utils.registry import Registry, same_object

__all__ = ["BatchRewardManager", "NaiveRewardManager", "get_reward_manager_cls", "register_reward_manager",
           "registered_reward_managers"]

logger = logging.getLogger(__name__)

_MANAGERS: Registry = Registry(
    "reward manager", "reward_model.reward_manager", may_replace=same_object,
    duplicate_error=lambda name, old, new: f"reward manager {name!r} is already registered as {old.__qualname__}",
    unknown_error=lambda name, names: f"unknown reward_model.reward_manager {name!r}; valid: {names}")
_MAX_LOGGED_CHARS = 500


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator adding a reward manager under ``name`` (``reward_model.reward_manager``). The
    class describes itself: its ``batched`` attribute (default false) says that a custom scorer
    (``custom_reward_function``) receives whole batches (``data_sources, solution_strs, ...``)."""
    return _MANAGERS.register(name)


def registered_reward_managers() -> list[str]:
    """Names of all registered reward managers."""
    return _MANAGERS.names()


def get_reward_manager_cls(name: str) -> type:
    """The manager class registered as ``name``; ValueError listing the valid names otherwise."""
    return _MANAGERS.get(name)


class _Rows(NamedTuple):
    """What the scorer sees for each of the B rows, plus where the score goes."""

    solution_strs: list[str]
    ground_truths: list[Any]
    data_sources: list[Any]
    extra_infos: list[Any]
    last_index: torch.Tensor  # [B] int64: last valid response position, -1 if the response is empty
    score_index: torch.Tensor  # [B] int64: where the score goes (the last model token), -1 if none


def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """[B] position of the last nonzero of ``mask`` [B, R] (-1 when none)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # [B, R]
    return torch.where(mask.bool(), positions, -1).amax(dim=1).cpu()  # [B]


def _valid_indices(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] last valid response token, [B] last model token) from the masks; -1 when none."""
    num_resp = data.batch["responses"].shape[1]
    keys = data.batch.keys()
    if "attention_mask" not in keys and "response_mask" not in keys:
        raise ValueError("the reward manager needs 'attention_mask' [B, P+R] or 'response_mask' [B, R] in "
                         f"DataProto.batch to find the valid response tokens; got {sorted(keys)}")
    # as veRL: the response part of prompt||response (observations included)
    valid = _last_index(data.batch["attention_mask"][:, -num_resp:] if "attention_mask" in keys
                        else data.batch["response_mask"])
    scored = _last_index(data.batch["response_mask"]) if "response_mask" in keys else valid
    return valid, scored


_TRAJECTORY_COLUMNS = ("tool_rewards", "turn_scores", "num_turns")


def _with_trajectory_info(data: DataProto, extra_infos: list[Any]) -> list[Any]:
    """Each row's extra_info plus the multi-turn rollout's columns (when the batch has them)."""
    columns = [k for k in _TRAJECTORY_COLUMNS if k in data.non_tensor_batch]
    if not columns:
        return extra_infos
    return [{**(info if isinstance(info, dict) else {}), **{k: data.non_tensor_batch[k][i] for k in columns}}
            for i, info in enumerate(extra_infos)]


def _trajectory_rewards(data: DataProto) -> torch.Tensor:
    """[B] sum of each row's ``tool_rewards`` and ``turn_scores`` (0 without those columns)."""
    total = torch.zeros(len(data), dtype=torch.float32)
    for key in ("tool_rewards", "turn_scores"):
        for i, values in enumerate(data.non_tensor_batch.get(key, [])):
            total[i] += float(sum(values or []))
    return total


AGENT_SCORED = "agent"
"""``reward_model.style`` of rows that their agent scores (an environment, a black-box agent): the
reward function is never called for them; one that comes back without a ``reward_score`` scores 0 and
counts as invalid."""


def _given_scores(data: DataProto) -> list[Optional[float]] | None:
    """Per row: the ``reward_score`` column's finite value (an agent scored its own row: an agent loop's
    ``AgentLoopOutput.reward_score``, an environment's return), NaN for an agent-scored row without one,
    None for rows the reward function scores. None when no row has a given score or agent style."""
    column = data.non_tensor_batch.get("reward_score")
    styles = [rm.get("style") if isinstance(rm, dict) else None
              for rm in data.non_tensor_batch.get("reward_model", [None] * len(data))]
    if column is None and AGENT_SCORED not in styles:
        return None
    given = [None if column is None or column[i] is None else finite_float(column[i]) for i in range(len(data))]
    return [math.nan if g is None and style == AGENT_SCORED else g for g, style in zip(given, styles)]


def _ground_truth(reward_model: Any, row: int) -> Any:
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise ValueError(f"row {row}: non_tensor_batch['reward_model'] must be a dict with a 'ground_truth' key, "
                         f"got {reward_model!r:.200}; check the dataset's reward_model column")
    return reward_model["ground_truth"]


def _require_non_tensor(data: DataProto, key: str, hint: str) -> np.ndarray:
    if key not in data.non_tensor_batch:
        raise ValueError(f"DataProto.non_tensor_batch has no {key!r} ({hint}); present keys: "
                         f"{sorted(data.non_tensor_batch)}")
    return data.non_tensor_batch[key]


def _normalize_batch(raw: Any, num_rows: int) -> list[ScoreOutcome]:
    if isinstance(raw, (np.ndarray, torch.Tensor)):
        raw = raw.tolist()
    if not isinstance(raw, (list, tuple)) or len(raw) != num_rows:
        shown = f"length {len(raw)}" if isinstance(raw, (list, tuple)) else type(raw).__name__
        msg = f"batched compute_score must return a list of {num_rows} scores, got {shown}"
        return [ScoreOutcome(0.0, {}, "invalid", msg)] * num_rows
    return [normalize_score(item) for item in raw]


def _truncate(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_LOGGED_CHARS else text[:_MAX_LOGGED_CHARS] + f"... [{len(text)} chars]"


class _RewardManagerBase(abc.ABC):
    """Shared decoding, tensor placement, metrics and logging; subclasses implement ``_score``.

    Args:
        tokenizer: decodes ``responses`` (special tokens skipped, as veRL).
        num_examine: decoded samples logged (INFO) per data source per call; 0 disables.
        compute_score: the scorer; None = the built-in dispatcher by data source.
        reward_fn_key: ``non_tensor_batch`` key holding each row's data source.
        timeout_s: time bound of one scorer call (per row for ``naive``, whole batch for ``batch``);
            <= 0 disables it.
        tool_reward_weight: weight of a multi-turn row's tool rewards and turn scores added to its score.
        num_workers: rows scored at once (``naive``: the rows are split into this many contiguous
            shares, each scored by its own guarded runner in its own thread; veRL's
            ``reward.num_workers``). 1 = one after another.
        isolation: ``"process"`` (default on POSIX) or ``"thread"``, see :mod:`hybrid_rl.reward._isolation`.
        avoid_fork: this process is large (it hosts the models: ``trainer.single_process``), so a
            fork costs copy-on-write faults on every page it then writes (~0.5-1 s per step at 5 GiB):
            with ``isolation`` unset, rows whose scorers are all built-in linear-time parsers
            (:func:`~hybrid_rl.reward.registry.thread_safe_sources`) are scored in a thread instead.
        **reward_kwargs: extra keyword arguments passed to every ``compute_score`` call.
    """

    _default_compute_score: Callable[..., Any]

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", timeout_s: float = 10.0, isolation: str | None = None,
                 tool_reward_weight: float = 0.0, avoid_fork: bool = False, num_workers: int = 1,
                 **reward_kwargs: Any) -> None:
        if int(num_workers) < 1:
            raise ValueError(f"reward_model.num_workers={num_workers} must be >= 1 (1: rows scored one after another).")
        self.num_workers = int(num_workers)
        self.tokenizer = tokenizer
        self.num_examine = int(num_examine)
        self.uses_default_scorer = compute_score is None
        self.compute_score = compute_score or type(self)._default_compute_score
        self.reward_fn_key = reward_fn_key
        self.timeout_s = float(timeout_s)
        self.isolation = isolation
        self.avoid_fork = avoid_fork
        self.tool_reward_weight = float(tool_reward_weight)
        self.reward_kwargs = reward_kwargs
        self.last_metrics: dict[str, float] = {}
        self._logged_failure_kinds: set[str] = set()

    def _isolation(self, data_sources: list) -> str | None:
        """The guard's isolation for rows of ``data_sources`` (see ``avoid_fork``)."""
        if self.isolation is None and self.avoid_fork and self.uses_default_scorer and thread_safe_sources(data_sources):
            return "thread"
        return self.isolation

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores`` float32 [B, R], or ``{"reward_tensor", "reward_extra_info", "reward_metrics"}``."""
        if "rm_scores" in data.batch.keys():  # a reward model already scored the batch (veRL behaviour)
            self.last_metrics = self._metrics([])
            return self._result(data.batch["rm_scores"], {}, self.last_metrics, return_dict)
        given = _given_scores(data)
        rows = self._rows(data, given)
        outcomes = self._scored(rows, given) if rows.solution_strs else []
        responses = data.batch["responses"]
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)  # [B, R]
        scores = torch.tensor([o.score for o in outcomes], dtype=torch.float32)  # [B]
        if self.tool_reward_weight and len(scores):
            scores = scores + self.tool_reward_weight * _trajectory_rewards(data)
        has_token = rows.score_index >= 0  # [B]
        reward_tensor[has_token.nonzero(as_tuple=True)[0], rows.score_index[has_token]] = scores[has_token]
        self._log_failures(rows, outcomes)
        self._log_examples(data, rows, outcomes)
        self.last_metrics = self._metrics(outcomes)
        return self._result(reward_tensor.to(responses.device), self._extra_info(outcomes), self.last_metrics,
                            return_dict)

    @abc.abstractmethod
    def _score(self, rows: _Rows) -> list[ScoreOutcome]:
        """One outcome per row, in row order."""

    def _scored(self, rows: _Rows, given: list[Optional[float]] | None) -> list[ScoreOutcome]:
        """``_score`` of the rows without a given score; the given ones as they are."""
        if given is None:
            return self._score(rows)
        todo = [i for i, g in enumerate(given) if g is None]
        picked = [[column[i] for i in todo] for column in rows[:4]]
        scored = iter(self._score(_Rows(*picked, rows.last_index[todo], rows.score_index[todo])) if todo else [])
        invalid = ScoreOutcome(0.0, {}, "invalid", f"reward_model.style={AGENT_SCORED!r}: the row's agent returned "
                               "no reward_score (its loop must set AgentLoopOutput.reward_score)")
        return [next(scored) if g is None else invalid if math.isnan(g) else ScoreOutcome(g, {}, "ok") for g in given]

    def _rows(self, data: DataProto, given: list[Optional[float]] | None = None) -> _Rows:
        last_index, score_index = _valid_indices(data)  # [B], [B]
        responses = data.batch["responses"].cpu()
        token_lists = [responses[i, : int(last) + 1].tolist() for i, last in enumerate(last_index)]
        solution_strs = self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
        reward_models = _require_non_tensor(data, "reward_model", "a dict per row with 'ground_truth'")
        data_sources = list(_require_non_tensor(data, self.reward_fn_key, "set by reward_fn_key"))
        extra = data.non_tensor_batch.get("extra_info")
        extra_infos = _with_trajectory_info(data, list(extra) if extra is not None else [None] * len(data))
        ground_truths = [None if given is not None and given[i] is not None else _ground_truth(rm, i)
                         for i, rm in enumerate(reward_models)]
        if self.uses_default_scorer:
            # Unknown source = a config error: fail loudly, not as N zero rewards.
            check_data_sources([d for i, d in enumerate(data_sources) if given is None or given[i] is None],
                               warmup=True, agent_rows="agent_name" in data.non_tensor_batch)
        return _Rows(solution_strs, ground_truths, data_sources, extra_infos, last_index, score_index)

    @staticmethod
    def _result(reward_tensor, extra_info, metrics, return_dict):
        if not return_dict:
            return reward_tensor
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info, "reward_metrics": dict(metrics)}

    @staticmethod
    def _extra_info(outcomes: list[ScoreOutcome]) -> dict[str, list]:
        keys = list(dict.fromkeys(k for o in outcomes for k in o.extra))
        if not keys:
            return {}
        info = {"score": [o.score for o in outcomes]}
        info.update({k: [o.extra.get(k) for o in outcomes] for k in keys if k != "score"})
        return info

    @staticmethod
    def _metrics(outcomes: list[ScoreOutcome]) -> dict[str, float]:
        counts = Counter(o.status for o in outcomes)
        failed = len(outcomes) - counts["ok"]
        counters: Counter = Counter()  # a scorer's own counters: numeric extras named "reward/...", summed
        for outcome in outcomes:
            for key, value in outcome.extra.items():
                if key.startswith("reward/") and finite_float(value) is not None:
                    counters[key] += finite_float(value)
        return {
            **counters,
            "reward/num_errors": counts["error"],
            "reward/num_timeouts": counts["timeout"],
            "reward/num_invalid": counts["invalid"],
            "reward/num_failed": failed,
            "reward/num_samples": len(outcomes),
            "reward/all_failed": float(bool(outcomes) and failed == len(outcomes)),
        }

    def _log_failures(self, rows: _Rows, outcomes: list[ScoreOutcome]) -> None:
        for i, outcome in enumerate(outcomes):
            if outcome.status == "ok" or outcome.status in self._logged_failure_kinds:
                continue
            self._logged_failure_kinds.add(outcome.status)  # once per kind, or a bad scorer floods the log
            logger.warning(
                "reward %s (scored 0.0; further %s failures are only counted in reward/num_*): %s\n"
                "  data_source=%r ground_truth=%s\n  solution_str=%s",
                outcome.status, outcome.status, outcome.message, rows.data_sources[i],
                _truncate(rows.ground_truths[i]), _truncate(rows.solution_strs[i]),
            )

    def _log_examples(self, data: DataProto, rows: _Rows, outcomes: list[ScoreOutcome]) -> None:
        if self.num_examine <= 0 or not logger.isEnabledFor(logging.INFO):
            return
        shown: Counter = Counter()
        for i, outcome in enumerate(outcomes):
            source = rows.data_sources[i]
            if shown[source] >= self.num_examine:
                continue
            shown[source] += 1
            logger.info("[%s] prompt: %s\n[response] %s\n[ground_truth] %s\n[score] %s (%s)", source,
                        _truncate(self._prompt_text(data, i)), _truncate(rows.solution_strs[i]),
                        _truncate(rows.ground_truths[i]), outcome.score, outcome.status)

    def _prompt_text(self, data: DataProto, row: int) -> str:
        if "prompts" not in data.batch.keys():
            return "<no 'prompts' in batch>"
        prompt = data.batch["prompts"][row]  # [P], left-padded
        if "attention_mask" in data.batch.keys():
            prompt = prompt[data.batch["attention_mask"][row, : prompt.shape[0]].bool()]
        return self.tokenizer.decode(prompt.tolist(), skip_special_tokens=True)


@register_reward_manager("naive")
class NaiveRewardManager(_RewardManagerBase):
    """One guarded ``compute_score`` call per row (each bounded by ``timeout_s``), ``num_workers`` at once."""

    batched = False

    _default_compute_score = staticmethod(default_compute_score)

    def _score(self, rows: _Rows) -> list[ScoreOutcome]:
        calls = [((), dict(data_source=ds, solution_str=s, ground_truth=gt, extra_info=ei, **self.reward_kwargs))
                 for ds, s, gt, ei in zip(rows.data_sources, rows.solution_strs, rows.ground_truths,
                                          rows.extra_infos)]
        isolation = self._isolation(rows.data_sources)
        shares = min(self.num_workers, len(calls))
        if shares <= 1:
            return safe_score_many(self.compute_score, calls, timeout_s=self.timeout_s, isolation=isolation)
        bounds = [len(calls) * k // shares for k in range(shares + 1)]  # contiguous shares, row order kept
        with ThreadPoolExecutor(max_workers=shares, thread_name_prefix="hybrid_rl-score") as pool:
            parts = pool.map(lambda k: safe_score_many(self.compute_score, calls[bounds[k]:bounds[k + 1]],
                                                       timeout_s=self.timeout_s, isolation=isolation), range(shares))
            return [outcome for part in parts for outcome in part]


@register_reward_manager("batch")
class BatchRewardManager(_RewardManagerBase):
    """One guarded batched ``compute_score`` call for all rows (bounded as a whole by ``timeout_s``)."""

    batched = True

    _default_compute_score = staticmethod(default_compute_score_batched)

    def _score(self, rows: _Rows) -> list[ScoreOutcome]:
        num_rows = len(rows.solution_strs)
        fn, kwargs = self.compute_score, dict(
            data_sources=rows.data_sources, solution_strs=rows.solution_strs, ground_truths=rows.ground_truths,
            extra_infos=rows.extra_infos, **self.reward_kwargs)
        status, value = run_guarded(lambda: _normalize_batch(fn(**kwargs), num_rows), self.timeout_s,
                                    self._isolation(rows.data_sources))
        if status == "ok":
            return value
        return [ScoreOutcome(0.0, {}, status, str(value))] * num_rows
