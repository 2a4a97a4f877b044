"""Custom agent loops, shaped like veRL's ``AgentLoopBase`` (``verl/experimental/agent_loop``).

An agent loop owns one row's whole trajectory: it builds the prompt, calls the model through
``self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` as often as it likes,
runs whatever it wants between calls (tools, an environment, a LangGraph graph), and returns an
:class:`AgentLoopOutput`: prompt ids, response ids (its sampled tokens and anything it inserted),
the response mask (1 = sampled by the model, 0 = inserted), the sampled tokens' log-probs and the
number of turns. Every row is its own coroutine; the model calls of all rows are batched onto the
rollout engine (:class:`hybrid_rl.agents.server.BatchingServer`).

A row picks its loop with its ``agent_name`` column (``actor_rollout_ref.rollout.agent.default_agent_loop``
when absent). Loops come from ``@register("name")`` on the class, or from the YAML at
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (veRL's layout: a list of entries, each a
``name``, a ``_target_`` class path and keyword arguments for its constructor)::

    - name: math_expression
      _target_: my_pkg.agents.MathExpressionAgentLoop
      max_terms: 6

Built in: ``tool_agent`` (the batched tool/interaction loop, :mod:`hybrid_rl.agents.loop`) and
``single_turn_agent``. Constructor arguments are veRL's: ``trainer_config`` (``.config`` holds
``actor_rollout_ref.rollout.*``, the rollout's settings, as an OmegaConf tree), ``server_manager``,
``tokenizer``, ``processor`` (None: text only), ``dataset_cls``, ``dataset_config`` and the entry's
keyword arguments. ``run(sampling_params, **kwargs)`` receives the row's non-tensor columns
(``raw_prompt``, ``extra_info``, ``tools_kwargs``, ``reward_model``, ``index``, ...).
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field

from hybrid_rl.utils.registry import EntryInfo, Registry, first_doc_line

__all__ = ["AgentLoopBase", "AgentLoopOutput", "DictConfigWrap", "agent_loop_names", "check_agent_loops",
           "load_agent_loop_config", "register", "resolve_agent_loop"]

BUILTIN_AGENT_LOOPS = ("tool_agent", "single_turn_agent")
"""Loops the batched tool loop runs (hybrid_rl.agents.loop), not a per-row coroutine."""

_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


class AgentLoopOutput(BaseModel):
    """One row's trajectory (veRL's ``AgentLoopOutput``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    prompt_ids: list[int]
    """The prompt's token ids (without padding)."""
    response_ids: list[int]
    """Everything after the prompt, in order: sampled tokens and inserted (tool, environment) tokens."""
    response_mask: list[int]
    """1 on sampled tokens, 0 on inserted ones; as long as ``response_ids``."""
    response_logprobs: Optional[list[float]] = None
    """The engine's log-prob of each response token (0 on inserted ones); None = not recorded."""
    reward_score: Optional[float] = None
    """The row's score; when set, the reward function is not called for this row (veRL's semantics)."""
    num_turns: int = 0
    """Chat turns: user, assistant and tool/environment turns."""
    metrics: dict[str, Any] = Field(default_factory=dict)
    """Numbers reported per row (``agent/<key>/mean`` of the step)."""
    extra_fields: dict[str, Any] = Field(default_factory=dict)
    """``tool_rewards`` / ``turn_scores`` lists reach the reward function as the tool loop's do."""
    multi_modal_data: Optional[dict[str, Any]] = None
    """Refused when non-empty: hybrid_rl's rollout is text-only."""
    routed_experts: Optional[Any] = None
    """Accepted for veRL's signature and ignored (no MoE routing replay)."""


class DictConfigWrap:
    """veRL's wrapper of the trainer config handed to agent loops (``trainer_config.config``)."""

    def __init__(self, config: Any):
        self.config = config


class AgentLoopBase(abc.ABC):
    """Subclass and implement :meth:`run`; one instance is created per row (as veRL does).

    Args:
        trainer_config: ``.config`` is an OmegaConf tree with ``actor_rollout_ref.rollout.*``.
        server_manager: ``await server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``.
        tokenizer: the rollout's tokenizer.
        processor: None (text only).
    """

    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any = None,
                 dataset_cls: Any = None, dataset_config: Any = None, **kwargs: Any):
        if kwargs:  # a YAML key no constructor took: most likely misspelt
            raise ValueError(f"agent loop {type(self).__name__} got unexpected settings {sorted(kwargs)}. Fix: "
                             "remove or correct them in the agent-loop YAML entry.")
        self.config = trainer_config.config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.dataset_config = getattr(dataset_config, "config", dataset_config)

    async def apply_chat_template(self, messages: list[dict], tools: Optional[list[dict]] = None, images: Any = None,
                                  videos: Any = None, remove_system_prompt: bool = False) -> list[int]:
        """Token ids of ``messages`` through the tokenizer's chat template, with the generation prompt.
        ``remove_system_prompt`` drops the ids the template puts before the first message when given
        none (the default system turn), for appending new messages to a running conversation."""
        if images or videos:
            raise ValueError("images / videos: hybrid_rl's rollout is text-only. Fix: pass text messages only.")
        ids = _token_ids(self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                            tokenize=True))
        if remove_system_prompt:
            ids = ids[len(self._system_prefix()):]
        return ids

    def _system_prefix(self) -> list[int]:
        """The ids a template renders before the first user turn when given no system message: one
        user turn's render minus the length one more user turn adds."""
        turn = [{"role": "user", "content": ""}]
        one = _token_ids(self.tokenizer.apply_chat_template(turn, add_generation_prompt=False, tokenize=True))
        two = _token_ids(self.tokenizer.apply_chat_template(turn * 2, add_generation_prompt=False, tokenize=True))
        return one[: len(one) - (len(two) - len(one))]

    @abc.abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run one row: ``sampling_params`` are the rollout's (temperature, top_p, top_k, logprobs),
        ``kwargs`` the row's non-tensor columns."""


def _token_ids(rendered: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)``'s ids: a list, or (newer transformers) a mapping holding them."""
    if hasattr(rendered, "keys") and "input_ids" in rendered:
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


@dataclass(frozen=True)
class AgentLoopEntry:
    """A registered agent loop."""

    config: dict[str, Any]
    """Its constructor config (``_target_`` and keyword arguments), as veRL's registry."""
    cls: Optional[type] = None
    """The class itself, for loops registered with @register (also those defined in a notebook);
    None: imported from ``_target_`` when built."""


_REGISTRY: Registry[EntryInfo] = Registry(
    "agent loop", "a row's agent_name (default: actor_rollout_ref.rollout.agent.default_agent_loop)",
    may_replace=lambda old, new: True)  # as veRL's: a loop registered again replaces the old one
for _name, _text in (("tool_agent", "Built in: the batched tool and interaction loop (hybrid_rl.agents.loop)."),
                     ("single_turn_agent", "Built in: one completion per row, through the agent path.")):
    _REGISTRY.add(_name, AgentLoopEntry({}), EntryInfo(_text))  # run by the rollout itself, never built


def register(agent_name: str) -> Callable[[type], type]:
    """Class decorator: rows whose ``agent_name`` is ``agent_name`` run this loop."""

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and callable(getattr(cls, "run", None))):
            raise ValueError(f"@register({agent_name!r}) decorates {cls!r}, which has no run(). Fix: subclass "
                             "hybrid_rl.agents.AgentLoopBase.")
        if agent_name in BUILTIN_AGENT_LOOPS:
            raise ValueError(f"@register({agent_name!r}): that name is a built-in loop. Fix: pick another name.")
        _REGISTRY.add(agent_name, AgentLoopEntry({"_target_": f"{cls.__module__}.{cls.__qualname__}"}, cls),
                      EntryInfo(description=first_doc_line(cls)))
        return cls

    return decorator


def agent_loop_names() -> list[str]:
    """Every agent name a row may use: the built-ins and the registered loops."""
    return sorted(set(BUILTIN_AGENT_LOOPS) | set(_REGISTRY.names()))


def load_agent_loop_config(path: str) -> dict[str, dict[str, Any]]:
    """Read veRL's agent-loop YAML (a list of ``{name, _target_, **kwargs}``) and register each entry;
    returns ``{name: config}``. One-line ValueError naming the file and entry otherwise."""
    import yaml

    if not os.path.isfile(path):
        raise ValueError(f"{_KEY}={path!r}: no such file. Fix: point it at a YAML list of "
                         "{name: ..., _target_: my_pkg.MyAgentLoop} entries (docs/agents.md).")
    with open(path, encoding="utf-8") as f:
        try:
            entries = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f"{_KEY}={path!r} is not valid YAML ({exc}). Fix: check its indentation.") from None
    if not isinstance(entries, list):
        raise ValueError(f"{_KEY}={path!r} must be a YAML list of entries, each with name and _target_. "
                         "Fix: see docs/agents.md.")
    loaded = {}
    for i, entry in enumerate(entries):
        where = f"{_KEY}={path!r} entry {i}"
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("_target_"), str)):
            raise ValueError(f"{where} needs a name and a _target_ (the loop's class path), got {entry!r:.200}. "
                             "Fix: write - name: my_agent\\n  _target_: my_pkg.MyAgentLoop")
        if entry["name"] in BUILTIN_AGENT_LOOPS:
            raise ValueError(f"{where}: {entry['name']!r} is a built-in loop's name. Fix: pick another name.")
        cls = _import_target(entry["_target_"], where)
        loaded[entry["name"]] = (dict(entry), first_doc_line(cls))
    for name, (config, description) in loaded.items():
        config.pop("name")
        _REGISTRY.add(name, AgentLoopEntry(config), EntryInfo(description=description))
    return {name: config for name, (config, _) in loaded.items()}


def _import_target(target: str, where: str) -> type:
    from hybrid_rl.agents.tool import import_object

    try:
        cls = import_object(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot import _target_ {target!r} ({type(exc).__name__}: {exc}). Fix: use the "
                         "dotted path of an importable AgentLoopBase subclass.") from None
    if not (isinstance(cls, type) and callable(getattr(cls, "run", None))):
        raise ValueError(f"{where}: _target_ {target!r} has no run(). Fix: subclass hybrid_rl.agents.AgentLoopBase.")
    return cls


def resolve_agent_loop(name: str, **kwargs: Any) -> Any:
    """A new instance of the loop registered as ``name``, given veRL's constructor arguments."""
    entry = _REGISTRY.get(name)
    config = dict(entry.config)
    target = config.pop("_target_")
    cls = entry.cls or _import_target(target, f"agent loop {name!r}")
    return cls(**config, **kwargs)


def check_agent_loops(names: Iterable[str], trainer_config: DictConfigWrap, tokenizer: Any) -> None:
    """Build each loop of ``names`` once (no model behind it), so a wrong ``agent:`` / ``env:`` path, a
    bad or misspelt setting fails here in one line naming the entry instead of zeroing its rows."""
    for name in sorted(names):
        try:
            resolve_agent_loop(name, trainer_config=trainer_config, server_manager=None, tokenizer=tokenizer,
                               processor=None, dataset_cls=None, dataset_config=DictConfigWrap({}))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"agent loop {name!r} ({_REGISTRY.get(name).config.get('_target_')}): {exc}") from None


def agent_loop_snapshot() -> dict[str, Any]:
    """The registry, for rollout workers in other processes (:mod:`hybrid_rl.agents.plugins`)."""
    return {"entries": _REGISTRY.entries(), "infos": _REGISTRY.describe()}


def restore_agent_loops(snapshot: dict[str, Any]) -> None:
    """Register what :func:`agent_loop_snapshot` carried."""
    infos = snapshot.get("infos", {})
    for name, entry in snapshot.get("entries", {}).items():
        _REGISTRY.add(name, entry, infos.get(name))
