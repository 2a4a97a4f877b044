"""The multi-turn agent loop: model turn, tool calls / interaction reply, model turn, ... per row.

Engine-agnostic: the rollout engine is a ``generate(token_lists, max_tokens, turn)`` callable that
continues every active trajectory by one model turn in ONE batched call. Per round:

1. every active trajectory generates its next turn (its exact sampled ids are appended, mask 1);
2. a trajectory ends when its token budget (``response_length``) is spent or the turn did not end
   with EOS (``length``), a turn limit is hit (``max_assistant_turns`` / ``max_user_turns``), an
   interaction terminates it (``interaction``), or the model answered without calling a tool and has
   no interaction (``stop``);
3. the tool calls of all trajectories run concurrently (bounded, :class:`AsyncRunner`); their results
   become one observation per trajectory, rendered as a delta through the chat template (mask 0); an
   observation that would overrun the budget ends the trajectory instead (``length``, as veRL).

Tool instances are created at a trajectory's first call of each tool (``create_kwargs`` from the row's
``extra_info.tools_kwargs``) and kept for the whole trajectory; at the end each instance's
``calc_reward`` is added to the row's ``tool_rewards`` and it is released.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.config import MultiTurnConfig
from hybrid_rl.agents.executor import AsyncRunner
from hybrid_rl.agents.interaction import BaseInteraction
from hybrid_rl.agents.parser import ToolCall, get_tool_parser
from hybrid_rl.agents.tool import BaseTool, call_create, tool_method
from hybrid_rl.reward.guard import finite_float  # the reward guard's rule for untrusted numbers

__all__ = ["AgentLoop", "GenerateFn", "RowContext", "Trajectory", "END_REASONS", "FAILURE_KINDS"]

logger = logging.getLogger(__name__)

GenerateFn = Callable[[list[list[int]], list[int], int], list[tuple[list[int], list[float]]]]
"""(token lists, max new tokens per row, turn index) -> one (new token ids, their log-probs) per row."""

END_REASONS = ("stop", "length", "max_assistant_turns", "max_user_turns", "interaction", "error")
"""``error``: a custom agent loop (or black-box agent) failed; its row is empty and scores 0."""
FAILURE_KINDS = ("timeout", "exception", "bad_return")
"""Why a custom agent loop's row failed (``end_reason`` ``error``): it ran past ``agent.timeout_s``, raised,
or returned something that is not a valid ``AgentLoopOutput`` (the row's ``agent_failure`` column)."""
SINGLE_TURN_AGENT = "single_turn_agent"


@dataclass
class RowContext:
    """What the loop reads from a row (non-tensor columns)."""

    tools_kwargs: dict = field(default_factory=dict)
    """``extra_info.tools_kwargs``: ``{tool name: {"create_kwargs": {...}}}``."""
    interaction_kwargs: dict = field(default_factory=dict)
    """``extra_info.interaction_kwargs`` (``name`` selects the interaction)."""
    messages: list = field(default_factory=list)
    """``raw_prompt`` chat messages (the conversation interactions see)."""
    agent_name: Optional[str] = None
    """``single_turn_agent`` = one model turn only; anything else runs the tool loop."""


@dataclass
class Trajectory:
    """One row's trajectory; ``response_ids`` = model tokens and observations, in order."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    """1 on sampled tokens, 0 on observation tokens."""
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    tool_metrics: dict[str, float] = field(default_factory=dict)
    """``tool/<name>/<key>``: the max over this trajectory's calls of each numeric metric a tool reported."""
    end_reason: Optional[str] = None
    reward_score: Optional[float] = None
    """Set by agents that score their own row: the reward function is skipped for it."""
    failure: str = ""
    """One of :data:`FAILURE_KINDS` when a custom loop failed (``end_reason`` ``error``); ``""`` otherwise."""
    messages: list = field(default_factory=list)
    instances: dict[str, str] = field(default_factory=dict)  # tool name -> instance id
    interaction_name: Optional[str] = None
    interaction_id: Optional[str] = None

    def extend(self, ids: Sequence[int], mask: int, log_probs: Optional[Sequence[float]] = None) -> None:
        self.response_ids += list(ids)
        self.response_mask += [mask] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None and len(log_probs) == len(ids) else [0.0] * len(ids)

    @property
    def num_turns(self) -> int:
        """User + assistant + observation turns, veRL's count (prompt turn included)."""
        return self.assistant_turns + self.user_turns + 1

    def metrics(self) -> dict[str, float]:
        """Per-row numbers for the batch metrics (``agent/...``)."""
        obs = len(self.response_mask) - sum(self.response_mask)
        return {"num_turns": float(self.num_turns), "assistant_turns": float(self.assistant_turns),
                "tool_calls": float(self.tool_calls), "tool_errors": float(self.tool_errors),
                "tool_timeouts": float(self.tool_timeouts), "observation_tokens": float(obs),
                "model_tokens": float(sum(self.response_mask)), **self.tool_metrics}


def truncate_text(text: str, limit: int, side: str) -> str:
    """veRL's character truncation of a tool result (see MultiTurnConfig.tool_response_truncate_side)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[len(text) - limit:]
    return text[: limit // 2] + "...(truncated)..." + text[len(text) - limit // 2:]


def _response_text(response: Any) -> tuple[Optional[str], Optional[str]]:
    """(text, error) of a tool's response: a string, or a ``ToolResponse``-shaped object or mapping
    (ours, veRL's) whose ``image`` / ``video`` must be empty (the rollout is text-only)."""
    if response is None or isinstance(response, str):
        return response or "", None
    fields = response if isinstance(response, dict) else {k: getattr(response, k, None) for k in ("text", "image", "video")}
    if not isinstance(response, dict) and not hasattr(response, "text"):
        return None, f"the tool returned {type(response).__name__} instead of text"
    media = [k for k in ("image", "video") if fields.get(k)]
    if media:
        return None, (f"the tool returned {' and '.join(media)} content, which hybrid_rl's text-only rollout cannot "
                      "show the model; return ToolResponse(text=...) only")
    text = fields.get("text")
    if text is not None and not isinstance(text, str):
        return None, f"the tool returned {type(text).__name__} instead of text"
    return text or "", None


def _as_observation(value: Any) -> tuple[Optional[str], float, dict, Optional[str]]:
    """(text, step reward, metrics, error) from what ``execute`` returned."""
    if not (isinstance(value, tuple) and len(value) == 3):
        return None, 0.0, {}, f"the tool returned {type(value).__name__}, expected (text, reward, metrics)"
    response, reward, metrics = value
    text, error = _response_text(response)
    if error is not None:
        return None, 0.0, {}, error
    number = finite_float(reward)
    if number is None:
        return None, 0.0, {}, f"the tool returned a reward that is not a finite number ({str(reward)[:40]})"
    return text, number, metrics if isinstance(metrics, dict) else {}, None


class AgentLoop:
    """Runs multi-turn trajectories for a batch of rows (see the module docstring).

    Args:
        config: the multi-turn settings.
        tokenizer: decodes model turns (tool-call parsing) and encodes observations.
        tools: ``{function name: tool}``; interactions: ``{name: interaction}``.
        eos_token_ids: the ids that end a model turn.
    """

    def __init__(self, config: MultiTurnConfig, tokenizer: Any, tools: dict[str, BaseTool],
                 interactions: dict[str, BaseInteraction], eos_token_ids: Sequence[int]):
        self.config = config
        self.tokenizer = tokenizer
        self.tools = tools
        self.interactions = interactions
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        self.encoder = ObservationEncoder(tokenizer, [tokenizer.decode([int(t)]) for t in eos_token_ids])
        self.encoder.check_roles((["tool"] if tools else []) + (["user"] if interactions else []))
        self.parse = get_tool_parser(config.format)
        self.runner = AsyncRunner()

    def run(self, prompts: list[list[int]], rows: list[RowContext], generate: GenerateFn,
            budget: int) -> list[Trajectory]:
        """One trajectory per prompt; each holds at most ``budget`` response tokens."""
        trajs = [Trajectory(prompt_ids=list(p), messages=list(r.messages)) for p, r in zip(prompts, rows)]
        self._start_interactions(trajs, rows)
        active = list(range(len(trajs)))
        turn = 0
        try:
            while active:
                outputs = generate([trajs[i].prompt_ids + trajs[i].response_ids for i in active],
                                   [budget - len(trajs[i].response_ids) for i in active], turn)
                tool_rows, talk_rows = [], []
                for i, (ids, log_probs) in zip(active, outputs):
                    calls = self._after_model_turn(trajs[i], rows[i], list(ids), log_probs, budget)
                    if calls:
                        tool_rows.append((i, calls))
                    elif trajs[i].end_reason is None:
                        talk_rows.append(i)
                observations = self._run_tools(trajs, rows, tool_rows) + self._run_interactions(trajs, rows, talk_rows)
                active = sorted(i for i, messages in observations if self._observe(trajs[i], messages, budget))
                turn += 1
        finally:
            self._finish(trajs)
        return trajs

    # ------------------------------------------------------------------ one model turn
    def _after_model_turn(self, traj: Trajectory, row: RowContext, ids: list[int], log_probs: Sequence[float],
                          budget: int) -> list[ToolCall]:
        """Append the sampled turn; set ``end_reason`` or return the turn's tool calls."""
        ids = ids[: budget - len(traj.response_ids)]
        traj.extend(ids, 1, log_probs[: len(ids)] if log_probs else None)
        traj.assistant_turns += 1
        if not ids or ids[-1] not in self.eos_token_ids:  # cut by the budget mid-turn
            traj.end_reason = "length"
            return []
        if row.agent_name == SINGLE_TURN_AGENT:
            traj.end_reason = "stop"
            return []
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        traj.messages.append({"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=True)})
        calls = self.parse(text) if self.tools else []
        if not calls and traj.interaction_id is None:
            traj.end_reason = "stop"  # the final answer
        elif self.config.max_assistant_turns and traj.assistant_turns >= self.config.max_assistant_turns:
            traj.end_reason = "max_assistant_turns"
        elif self.config.max_user_turns and traj.user_turns >= self.config.max_user_turns:
            traj.end_reason = "max_user_turns"
        return calls if traj.end_reason is None else []

    # ------------------------------------------------------------------ tools
    def _run_tools(self, trajs: list[Trajectory], rows: list[RowContext],
                   tool_rows: list[tuple[int, list[ToolCall]]]) -> list[tuple[int, list[dict]]]:
        """Execute every call of this round concurrently; one list of tool messages per trajectory."""
        jobs, texts = [], {}
        for i, calls in tool_rows:
            for k, call in enumerate(calls):
                problem = self._call_problem(call, k)
                if problem is not None:
                    trajs[i].tool_errors += 1
                    texts[(i, k)] = f"Error: {problem}"
                else:
                    jobs.append((i, k, call))
                trajs[i].tool_calls += 1
        failed_create = self._create_instances(trajs, rows, {(i, call.name) for i, _, call in jobs})
        runnable = [(i, k, call) for i, k, call in jobs if (i, call.name) not in failed_create]
        for i, k, call in jobs:
            if (i, call.name) in failed_create:
                texts[(i, k)] = self._record_result(trajs[i], call.name, *failed_create[(i, call.name)])
        results = self.runner.run([self._execute(trajs[i], call) for i, _, call in runnable], self.config.tool_timeout_s)
        for (i, k, call), (status, value) in zip(runnable, results):
            texts[(i, k)] = self._record_result(trajs[i], call.name, status, value)
        cfg = self.config
        return [(i, [{"role": "tool", "content": truncate_text(texts[(i, k)], cfg.max_tool_response_length,
                                                                cfg.tool_response_truncate_side)}
                     for k in range(len(calls))]) for i, calls in tool_rows]

    def _call_problem(self, call: ToolCall, position: int) -> Optional[str]:
        if call.error is not None:
            return call.error
        if call.name not in self.tools:
            return f"unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}"
        if position >= self.config.max_parallel_calls:
            return f"at most {self.config.max_parallel_calls} tool call(s) per turn; this one was not run"
        return None

    def _create_instances(self, trajs: list[Trajectory], rows: list[RowContext],
                          needed: set[tuple[int, str]]) -> dict[tuple[int, str], tuple[str, Any]]:
        """Create the tool instances this round's calls need (one per trajectory and tool, before any
        execute, so parallel calls of one tool share it); returns the failed ones' (status, message)."""
        needed = sorted((i, name) for i, name in needed if name not in trajs[i].instances)

        def create(i: int, name: str):
            kwargs = (rows[i].tools_kwargs.get(name) or {}).get("create_kwargs") or {}
            return lambda: call_create(self.tools[name], dict(kwargs))

        failed = {}
        for (i, name), (status, value) in zip(needed, self.runner.run([create(i, n) for i, n in needed],
                                                                       self.config.tool_timeout_s)):
            if status == "ok" and isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                trajs[i].instances[name] = value[0]
            else:
                failed[(i, name)] = (status if status != "ok" else "error",
                                     value if status != "ok" else "create() must return (instance_id, response)")
        return failed

    def _execute(self, traj: Trajectory, call: ToolCall):
        tool, instance_id, arguments = self.tools[call.name], traj.instances[call.name], call.arguments
        return lambda: tool.execute(instance_id, arguments)

    def _record_result(self, traj: Trajectory, name: str, status: str, value: Any) -> str:
        if status == "ok":
            text, reward, metrics, error = _as_observation(value)
            if error is None:
                traj.tool_rewards.append(reward)
                for key, raw in metrics.items():
                    number = finite_float(raw)
                    if number is not None:
                        metric = f"tool/{name}/{key}"
                        traj.tool_metrics[metric] = max(traj.tool_metrics.get(metric, -math.inf), number)
                return text
            status, value = "error", error
        traj.tool_errors += status == "error"
        traj.tool_timeouts += status == "timeout"
        return f"Error when executing tool {name!r}: {value}"

    # ------------------------------------------------------------------ interactions
    def _start_interactions(self, trajs: list[Trajectory], rows: list[RowContext]) -> None:
        jobs = []
        for i, row in enumerate(rows):
            if not self.interactions or not row.interaction_kwargs or row.agent_name == SINGLE_TURN_AGENT:
                continue  # rows without interaction_kwargs run without an interaction
            name = row.interaction_kwargs.get("name")
            if name not in self.interactions:
                raise ValueError(f"row {i}: extra_info.interaction_kwargs.name={name!r} is not a configured "
                                 f"interaction ({', '.join(sorted(self.interactions))}). Fix: set it to one of "
                                 "them in the dataset, or add it to interaction_config_path.")
            trajs[i].interaction_name = name
            interaction, kwargs = self.interactions[name], dict(row.interaction_kwargs)
            jobs.append((i, lambda interaction=interaction, kwargs=kwargs: interaction.start_interaction(**kwargs)))
        for (i, _), (status, value) in zip(jobs, self.runner.run([c for _, c in jobs], self.config.tool_timeout_s)):
            if status == "ok" and isinstance(value, str):
                trajs[i].interaction_id = value
            else:
                trajs[i].tool_errors += 1
                logger.warning("interaction start failed for row %d (%s): it runs without an interaction", i,
                               value if status != "ok" else f"start_interaction returned {type(value).__name__}")

    def _run_interactions(self, trajs: list[Trajectory], rows: list[RowContext],
                          talk_rows: list[int]) -> list[tuple[int, list[dict]]]:
        def respond(i: int):
            interaction, t, kwargs = self.interactions[trajs[i].interaction_name], trajs[i], rows[i].interaction_kwargs
            messages = list(t.messages)
            return lambda: interaction.generate_response(t.interaction_id, messages, **kwargs)

        out = []
        for i, (status, value) in zip(talk_rows, self.runner.run([respond(i) for i in talk_rows],
                                                                 self.config.tool_timeout_s)):
            reply = _as_reply(value) if status == "ok" else None
            if reply is None:  # the interaction failed or answered garbage: end the trajectory, count it
                trajs[i].end_reason = "interaction"
                trajs[i].tool_errors += status != "timeout"
                trajs[i].tool_timeouts += status == "timeout"
                continue
            terminate, text, score = reply
            if score is not None:
                trajs[i].turn_scores.append(score)
            if terminate:
                trajs[i].end_reason = "interaction"
            else:
                out.append((i, [{"role": "user", "content": text}]))
        return out

    # ------------------------------------------------------------------ observations and the end
    def _observe(self, traj: Trajectory, messages: list[dict], budget: int) -> bool:
        """Append an observation turn; False (trajectory ended) when it does not fit the budget."""
        ids = self.encoder.encode(messages)
        if len(traj.response_ids) + len(ids) >= budget:
            traj.end_reason = "length"
            return False
        traj.extend(ids, 0)
        traj.user_turns += 1
        traj.messages += messages
        return True

    def _finish(self, trajs: list[Trajectory]) -> None:
        """Final tool rewards, release instances and interactions (failures only logged)."""
        owned = [(t, name, iid) for t in trajs for name, iid in list(t.instances.items())]
        scored = [(t, tool_method(self.tools[n], "calc_reward"), iid) for t, n, iid in owned]
        scored = [(t, method, iid) for t, method, iid in scored if method is not None]
        rewards = self.runner.run([self._method(method, iid) for _, method, iid in scored], self.config.tool_timeout_s)
        for (t, _, _), (status, value) in zip(scored, rewards):
            number = finite_float(value) if status == "ok" else None
            if number is not None:
                t.tool_rewards.append(number)
        releases = [self._method(method, iid) for _, n, iid in owned
                    if (method := tool_method(self.tools[n], "release")) is not None]
        releases += [self._method(self.interactions[t.interaction_name].finalize_interaction, t.interaction_id)
                     for t in trajs if t.interaction_id is not None]
        self.runner.run(releases, self.config.tool_timeout_s)
        for t in trajs:
            t.end_reason = t.end_reason or "length"

    @staticmethod
    def _method(method: Callable, instance_id: str):
        return lambda: method(instance_id)


def _as_reply(value: Any) -> Optional[tuple[bool, str, Optional[float]]]:
    """(terminate, text, finite score or None) from ``generate_response``; None when malformed."""
    if not (isinstance(value, tuple) and len(value) == 4):
        return None
    terminate, text, score, _ = value
    try:
        terminate = bool(terminate)
    except Exception:
        return None
    if not isinstance(text, str):
        return None
    return terminate, text, finite_float(score)
