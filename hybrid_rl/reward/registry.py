"""Reward functions by ``data_source``: the registry, the default dispatcher, custom loading.

A scorer has veRL's signature ``fn(data_source, solution_str, ground_truth, extra_info=None)`` and
returns a float or ``{"score": float, ...extra}``. Reward managers call it with keyword arguments
(as veRL does), so the parameter *names* matter.

Duplicate names: registering a data source that already has a scorer raises, unless ``override=True``
or the new function is the same function redefined (same module and qualified name: re-running a
notebook cell or reloading a module), which replaces it silently -- what a user would expect.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import logging
import os
import sys
from functools import partial
from typing import Any, Callable

from hybrid_rl.reward.scorers import arithmetic, gsm8k, math
from hybrid_rl.utils.registry import EntryInfo, Registry, first_doc_line, same_definition

__all__ = [
    "MATH_DATA_SOURCES",
    "check_data_sources",
    "default_compute_score",
    "default_compute_score_batched",
    "get_reward_fn",
    "load_custom_reward_fn",
    "register_reward",
    "registered_data_sources",
    "thread_safe_sources",
    "unregister_reward",
]

logger = logging.getLogger(__name__)

ScoreFn = Callable[..., Any]


def _duplicate_source(source: str, existing: ScoreFn, fn: ScoreFn) -> str:
    return (f"data_source {source!r} already has the reward function "
            f"{existing.__module__}.{existing.__qualname__}; pass override=True to replace it "
            f"(`@register_reward({source!r}, override=True)`) or pick another name")


_REWARDS: Registry[EntryInfo] = Registry("reward function", "data_source (a row's data_source column)",
                                         may_replace=same_definition, duplicate_error=_duplicate_source)
_WARMUPS: dict[ScoreFn, Callable[[], None]] = {}  # scorer -> its costly one-time initialisation
_BOUNDED: set[ScoreFn] = set()  # built-in scorers that are linear-time pure Python (see thread_safe_sources)
# Data sources routed by prefix when no exact name matches: "<hub>/<task>" -> one scorer for the hub's tasks.
_PREFIX_ROUTES: dict[str, ScoreFn] = {}
_SAMPLE_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
_BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
_module_counter = itertools.count()
MATH_DATA_SOURCES = ("math", "lighteval/MATH", "HuggingFaceH4/MATH-500", "DigitalLearningGmbH/MATH-lighteval")
_HOW_TO_ADD = (
    "register one with `@hybrid_rl.reward.register_reward({name!r})` on a function "
    "`(data_source, solution_str, ground_truth, extra_info=None) -> float`, or point "
    "custom_reward_function.path/.name at a Python file defining it"
)


def check_scorer_signature(fn: Callable, what: str, batched: bool = False, **reward_kwargs: Any) -> None:
    """Raise ValueError unless ``fn(**{the scorer arguments}, **reward_kwargs)`` would bind."""
    names = _BATCH_ARGS if batched else _SAMPLE_ARGS
    if not callable(fn):
        raise ValueError(f"{what} is a {type(fn).__name__}, not a function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins/C callables without a signature: trust them, the guard catches misuse
    try:
        signature.bind(**{name: None for name in names}, **reward_kwargs)
    except TypeError as exc:
        extra = f" and the reward kwargs {sorted(reward_kwargs)}" if reward_kwargs else ""
        raise ValueError(
            f"{what} has signature {signature}, which cannot be called with the keyword arguments "
            f"({', '.join(names)}){extra}: {exc}. Define it as "
            f"`def {getattr(fn, '__name__', 'score')}({', '.join(names[:3])}, {names[3]}=None, **kwargs)`"
        ) from exc


def register_reward(*data_sources: str, override: bool = False,
                    description: str | None = None) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator registering a scorer for one or more ``data_source`` names (``description``: one line
    for ``--help``; default: the scorer's first docstring sentence).

    >>> @register_reward("my_source")
    ... def score(data_source, solution_str, ground_truth, extra_info=None):
    ...     return float(solution_str.strip() == ground_truth)
    """
    if len(data_sources) == 1 and callable(data_sources[0]):
        raise ValueError("register_reward needs the data source names: use @register_reward('my_source')")
    if not data_sources or not all(isinstance(s, str) and s for s in data_sources):
        raise ValueError(f"register_reward needs one or more non-empty data source names, got {data_sources!r}")

    def decorator(fn: ScoreFn) -> ScoreFn:
        check_scorer_signature(fn, f"reward function {getattr(fn, '__qualname__', fn)!r}")
        if not override:
            for source in data_sources:  # all names checked before any is taken
                _REWARDS.check_free(source, fn)
        info = EntryInfo(description=first_doc_line(fn) if description is None else description)
        for source in data_sources:
            if source in _REWARDS and _REWARDS.find(source) is not fn:
                logger.info("reward for data_source %r replaced by %s", source, getattr(fn, "__qualname__", fn))
            _REWARDS.add(source, fn, info, force=True)
        return fn

    return decorator


def unregister_reward(*data_sources: str) -> None:
    """Remove scorers (unknown names are ignored). Mostly for tests and notebooks."""
    for source in data_sources:
        _REWARDS.unregister(source)


def registered_data_sources() -> list[str]:
    """Sorted names that :func:`default_compute_score` can score."""
    return _REWARDS.names()


_AGENT_HINT = ("These rows run an agent loop (agent_name, or rollout.agent set): if the agent scores them (a "
               "black-box agent's return value, an environment's return), mark them reward_model: {style: agent} "
               "in the dataset so the reward function is skipped. Otherwise, to add a reward function, ")


def _unknown_source_error(data_source: Any, agent_rows: bool = False) -> ValueError:
    how = _AGENT_HINT if agent_rows else "To add it, "
    return ValueError(
        f"no reward function for data_source {data_source!r}. Known data sources: "
        f"{registered_data_sources()}. {how}" + _HOW_TO_ADD.format(name=data_source)
    )


def get_reward_fn(data_source: str, agent_rows: bool = False) -> ScoreFn:
    """The scorer registered for ``data_source``; ValueError naming the known ones otherwise (and,
    with ``agent_rows``, saying that rows an agent scores are marked ``reward_model.style: agent``)."""
    try:
        fn = _REWARDS.find(data_source)
    except TypeError:  # an unhashable data_source value
        fn = None
    if fn is None and isinstance(data_source, str):
        fn = next((route for prefix, route in _PREFIX_ROUTES.items() if data_source.startswith(prefix)), None)
    if fn is None:
        raise _unknown_source_error(data_source, agent_rows)
    return fn


def thread_safe_sources(data_sources) -> bool:
    """True when every data source is scored by a built-in scorer that is linear-time pure Python
    (no C routine that holds the GIL, no unbounded backtracking), so a thread's timeout can always
    fire: the arithmetic and GSM8K answer parsers. math-verify's symbolic checks and any user
    scorer are not."""
    return all(_REWARDS.find(source) in _BOUNDED for source in dict.fromkeys(data_sources))


def check_data_sources(data_sources, warmup: bool = False, agent_rows: bool = False) -> None:
    """Fail fast (before any scoring) if a data source in the batch has no scorer.

    ``warmup=True`` also runs the one-time initialisation of the built-in scorers involved, so it
    happens once in this process rather than in every forked scoring child. ``agent_rows``: the rows
    run agent loops (they have an ``agent_name``, or the agent config is set), so the error says how
    to mark rows their agent scores (``reward_model.style: agent``).
    """
    for source in dict.fromkeys(data_sources):
        fn = get_reward_fn(source, agent_rows)
        if warmup and fn in _WARMUPS:
            _WARMUPS[fn]()


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                          **kwargs: Any) -> float | dict:
    """Score one response with the scorer registered for ``data_source``; ``kwargs`` go to the scorer."""
    fn = get_reward_fn(data_source)
    return fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
              extra_info=extra_info, **kwargs)


def default_compute_score_batched(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list:
    """Batched form of :func:`default_compute_score` (the ``batch`` reward manager's default)."""
    return [default_compute_score(ds, s, gt, ei, **kwargs)
            for ds, s, gt, ei in zip(data_sources, solution_strs, ground_truths, extra_infos)]


def _import_from_path(path: str) -> Any:
    """Import the module at exactly ``path`` under a fresh unique name (never via sys.path)."""
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    name = f"hybrid_rl_custom_reward_{digest}_{next(_module_counter)}"
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses/pickle look modules up by name while executing
    try:
        loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # SyntaxError, ImportError, a module that calls exit()
        del sys.modules[name]
        raise ValueError(f"custom_reward_function.path {path!r} failed to import: "
                         f"{type(exc).__name__}: {exc}") from exc
    return module


def load_custom_reward_fn(path: str, name: str = "compute_score", reward_kwargs: dict | None = None,
                          batched: bool = False) -> ScoreFn:
    """Load ``name`` from the Python file at ``path``, optionally binding ``reward_kwargs``.

    The module is imported only from that exact file. ``batched=True`` checks the batch signature
    ``(data_sources, solution_strs, ground_truths, extra_infos)`` used by the ``batch`` manager.
    """
    if not path:
        raise ValueError("custom_reward_function.path is empty; set it to a Python file defining the scorer")
    path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise ValueError(f"custom_reward_function.path {path!r} does not exist or is not a file")
    module = _import_from_path(path)
    fn = getattr(module, name, None)
    if fn is None:
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                           and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"custom_reward_function.name {name!r} not found in {path}; functions defined "
                         f"there: {available}; set custom_reward_function.name to one of them")
    reward_kwargs = dict(reward_kwargs or {})
    check_scorer_signature(fn, f"custom reward function {name!r} in {path}", batched=batched, **reward_kwargs)
    logger.info("using custom reward function %r from %s", name, path)
    return partial(fn, **reward_kwargs) if reward_kwargs else fn


def _score_gsm8k(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return gsm8k.compute_score(solution_str, ground_truth, **kwargs)


def _score_math(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return math.compute_score(solution_str, ground_truth, **kwargs)


def _score_arithmetic(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return arithmetic.compute_score(solution_str, ground_truth, **kwargs)


register_reward("openai/gsm8k", description="GSM8K: the number after '####' equals the "
                "answer.")(_score_gsm8k)
register_reward(*MATH_DATA_SOURCES, description="MATH: the last \\boxed{} answer is equivalent to the "
                "solution's (math-verify).")(_score_math)
_WARMUPS[_score_math] = math.warmup
register_reward("arithmetic", "calculator", description="Arithmetic: the last '#### <integer>' equals the "
                "answer.")(_score_arithmetic)  # calculator: the tool task, same "#### N" answer
_BOUNDED.update({_score_gsm8k, _score_arithmetic})


def _score_code_exec(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    from hybrid_rl.reward.scorers import code_exec  # lazy: imports the sandbox only when code rows are scored

    return code_exec.compute_score(solution_str, ground_truth, **kwargs)


register_reward("code_exec", description="Code: the response's last code block passes the row's tests in the "
                "sandbox (hybrid_rl.reward.sandbox).")(_score_code_exec)


def _score_reasoning_gym(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    from hybrid_rl.hub import reasoning_gym  # lazy: the optional library loads only when such rows are scored

    return reasoning_gym.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def _warmup_reasoning_gym() -> None:
    from hybrid_rl.hub import reasoning_gym

    reasoning_gym.warmup()


_PREFIX_ROUTES["reasoning_gym/"] = _score_reasoning_gym  # every reasoning-gym task: its own score_answer
_WARMUPS[_score_reasoning_gym] = _warmup_reasoning_gym
