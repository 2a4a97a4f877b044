"""Typed settings of the multi-turn rollout (veRL ``actor_rollout_ref.rollout.multi_turn.*``).

Names and semantics follow veRL's ``MultiTurnConfig`` (``verl/workers/config/rollout.py``) and its
``ToolAgentLoop``; hybrid_rl's departures are noted per field and in docs/agents.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hybrid_rl.agents.parser import TOOL_CALL_FORMATS
from hybrid_rl.utils.bounds import bounded, check_bounds

__all__ = ["AGENT_ROWS", "AgentLoopConfig", "MultiTurnConfig", "TRUNCATE_SIDES", "agent_rollout_enabled"]

TRUNCATE_SIDES = ("left", "middle", "right")
AGENT_ROWS = ("chain", "every_call")
_PREFIX = "rollout.multi_turn"  # the loader completes it (actor_rollout_ref. under PPO)


def _check(ok: bool, key: str, value: Any, rule: str, fix: str) -> None:
    if not ok:
        raise ValueError(f"{_PREFIX}.{key}={value!r} is invalid: {rule}. Fix: {fix}.")


@dataclass(kw_only=True)
class MultiTurnConfig:
    """Multi-turn rollout with tools and interactions (``rollout.multi_turn.*``)."""

    enable: bool = False
    """Run rows as multi-turn trajectories: the model's turns, tool results and interaction replies
    alternate until the model answers without a tool call or a limit is hit. Rows whose ``agent_name``
    is ``single_turn_agent`` still get one turn."""
    max_assistant_turns: Optional[int] = bounded(None, ge=1, fix="use null (no limit) or e.g. 4")
    """Most model turns per trajectory; null = bounded only by response_length."""
    max_user_turns: Optional[int] = bounded(None, ge=1, fix="use null (no limit) or e.g. 4")
    """Most observation turns (tool-result rounds and interaction replies, as veRL counts them);
    null = no limit."""
    tool_config_path: Optional[str] = None
    """YAML listing the tools (veRL layout; docs/agents.md). null = no tools."""
    interaction_config_path: Optional[str] = None
    """YAML listing the interactions (simulated users); a row picks one with
    ``extra_info.interaction_kwargs.name``. null = none."""
    max_tool_response_length: int = bounded(256, ge=1, fix="use e.g. 256")
    """Longest tool result kept, in characters (as veRL); longer ones are cut per
    tool_response_truncate_side with a ``(truncated)`` marker."""
    tool_response_truncate_side: str = "middle"
    """left (keep the start), right (keep the end) or middle (keep both ends), veRL's semantics."""
    max_parallel_calls: int = bounded(1, ge=1, fix="use 1 or more")
    """Most tool calls run per model turn. veRL drops the extra calls silently; here each gets an
    error observation saying so (the model sees why, and it is counted)."""
    format: str = "hermes"
    """Tool-call syntax the model writes: ``hermes`` = ``<tool_call>{"name", "arguments"}</tool_call>``
    (Qwen2.5/3, Hermes), ``llama3_json`` = the turn is ``{"name", "parameters"}`` (Llama 3.1+),
    ``mistral`` = ``[TOOL_CALLS]`` then a JSON list or ``name[ARGS]{...}`` (Mistral v0.3+). The
    OpenAI-compatible endpoint of black-box agents reads the same format into ``tool_calls``."""
    tool_timeout_s: float = 10.0
    """Time bound of one tool or interaction call (create, execute, ...); a call that runs over
    becomes an error observation and counts in ``agent/tool_timeouts/mean``. <= 0 disables it."""

    def __post_init__(self) -> None:
        check_bounds(self, _PREFIX)
        for key in ("max_assistant_turns", "max_user_turns", "max_tool_response_length", "max_parallel_calls"):
            value = getattr(self, key)
            _check(value is None or isinstance(value, int), key, value, "must be an integer", "use e.g. 4")
        _check(self.tool_response_truncate_side in TRUNCATE_SIDES, "tool_response_truncate_side",
               self.tool_response_truncate_side, f"must be one of {TRUNCATE_SIDES}", "use middle")
        _check(self.format in TOOL_CALL_FORMATS, "format", self.format, f"must be one of {sorted(TOOL_CALL_FORMATS)}",
               "use hermes")
        _check(self.enable or (self.tool_config_path is None and self.interaction_config_path is None),
               "enable", self.enable, "tool_config_path / interaction_config_path are set but multi-turn is off",
               f"set {_PREFIX}.enable=true to use them")


@dataclass(kw_only=True)
class AgentLoopConfig:
    """Which agent loop runs each row (veRL ``actor_rollout_ref.rollout.agent.*``; docs/agents.md)."""

    default_agent_loop: Optional[str] = None
    """The loop of rows without an ``agent_name`` column: null = ``tool_agent`` when multi_turn.enable
    is true, else ``single_turn_agent`` (veRL's default)."""
    agent_loop_config_path: Optional[str] = None
    """veRL's agent-loop YAML: a list of ``{name, _target_: my_pkg.MyAgentLoop, **constructor kwargs}``;
    rows choose a loop with their ``agent_name``. null = only built-in and @register'ed loops."""
    timeout_s: float = 600.0
    """Bound of one row's whole custom loop (hybrid_rl's own key); a loop that runs over, raises or
    returns garbage gives its row an empty response scored 0 (``agent/ended_by/error``). <= 0: none."""
    batch_window_s: Optional[float] = bounded(1.0, ge=0, fix="use null (reproducible rounds) or e.g. 0.05")
    """Longest a model call of a custom loop waits for the other rows' calls before the engine serves
    the ones waiting (hybrid_rl's own key). A round starts at once when every running loop waits on
    the model (then rounds, and the samples, reproduce from the seed); the window only matters when a
    loop is busy elsewhere (a slow tool, a hung agent), which then delays the others by at most this
    long per round, and the rounds depend on timing. null = no window: fully reproducible, but a hung
    agent holds every other row back until its timeout."""

    progress_interval_s: Optional[float] = bounded(10.0, gt=0, fix="use null (no progress lines) or e.g. 10")
    """Seconds between the console's progress lines while custom agent loops run (rows done / running /
    failed; first after this long, then on a change, or every 6 intervals without one; hybrid_rl's own
    key). null = none."""
    rows: str = "chain"
    """Training rows per rollout of a black-box agent (``OpenAIAgentLoop``; hybrid_rl's own key):
    ``chain`` = one row, the longest chain of continued calls (calls off it are counted in
    ``agent/loop/calls_off_row`` and not trained); ``every_call`` = every call that continues no
    earlier call roots a row of its own (a sub-agent, a compacted context), all carrying the rollout's
    score; the advantage is computed once per rollout and shared by its rows (docs/agents.md,
    "Several rows per rollout")."""

    def __post_init__(self) -> None:
        prefix = "rollout.agent"  # completed by the loader, as _PREFIX
        check_bounds(self, prefix)
        if not isinstance(self.timeout_s, (int, float)):
            raise ValueError(f"{prefix}.timeout_s={self.timeout_s!r} is invalid: must be a number of seconds. "
                             "Fix: use e.g. 600 (or 0 for no bound).")
        if self.rows not in AGENT_ROWS:
            raise ValueError(f"{prefix}.rows={self.rows!r} is invalid: must be one of {AGENT_ROWS}. "
                             "Fix: use chain (one row per rollout) or every_call.")


def agent_rollout_enabled(rollout: Any) -> bool:
    """Rows run through agent loops (the rollout's :class:`MultiTurnGenerator`) when multi-turn is on or
    the ``agent`` section names loops; otherwise every row is one plain completion and ``agent_name``
    is ignored (the default run)."""
    agent = rollout.agent
    return bool(rollout.multi_turn.enable or agent.agent_loop_config_path or agent.default_agent_loop)
