"""Running custom agent loops for a batch of rows and turning their outputs into trajectories.

Each row runs its loop as a coroutine under a :class:`BatchingServer` (the engine serves all rows'
model calls in batched rounds). A loop that raises, runs past ``agent.timeout_s`` or returns something
that is not a valid :class:`AgentLoopOutput` never fails the step: its row gets an empty response, a
score of 0 (``reward_score``), ``end_reason="error"`` and its failure kind (``Trajectory.failure``:
``timeout``, ``exception`` or ``bad_return``), counted in ``agent/ended_by/error`` and
``agent/failure/<kind>``; each kind that occurred is logged once per call, with its count and first reason.
A failed loop that counts its model calls (``num_calls``, as ``OpenAIAgentLoop``) still reports them
(``loop/calls``). While the loops run, :class:`~hybrid_rl.agents.progress.AgentProgress` prints the rows
done / running / failed on the console every ``agent.progress_interval_s``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Optional

from hybrid_rl.agents.agent_loop import AgentLoopOutput, DictConfigWrap, resolve_agent_loop
from hybrid_rl.agents.loop import Trajectory
from hybrid_rl.agents.progress import AgentProgress
from hybrid_rl.agents.server import BatchingServer, LLMServerManager
from hybrid_rl.reward.guard import finite_float

__all__ = ["AgentLoopContext", "AgentReturnError", "failed_trajectory", "row_trajectories", "row_trajectory",
           "run_agent_loops", "trajectory_from_output"]

logger = logging.getLogger(__name__)

class AgentReturnError(ValueError):
    """Raised by a loop whose agent returned something unusable (``OpenAIAgentLoop``: a score that is not a
    number, no model call): its row fails as ``bad_return``, not as ``exception``."""


_KIND_OF_STATUS = {"timeout": "timeout", "error": "exception"}
"""BatchingServer's status of a loop that did not return -> the row's failure kind."""


@dataclass
class AgentLoopContext:
    """What every loop instance of a call is built with."""

    trainer_config: DictConfigWrap
    tokenizer: Any
    sampling_params: dict[str, Any]
    """veRL's per-call sampling settings: temperature, top_p, top_k, repetition_penalty, logprobs."""
    timeout_s: float
    """Bound of one row's whole loop (``agent.timeout_s``)."""
    progress_interval_s: Optional[float] = None
    """Seconds between progress lines while the loops run (``agent.progress_interval_s``); None: none."""
    several_rows: bool = False
    """A loop may return a list of outputs, one training row each (``agent.rows: every_call``); else a
    list is a bad return."""


def failed_trajectory(prompt: list[int], kind: str) -> Trajectory:
    """The row of a failed loop: an empty response scored 0, ``end_reason`` ``error``, its failure kind."""
    return Trajectory(prompt_ids=list(prompt), end_reason="error", reward_score=0.0, failure=kind)


def row_trajectory(status: str, value: Any, prompt: list[int], budget: int,
                   prompt_width: int) -> tuple[Trajectory, Optional[str]]:
    """(trajectory, None) of a loop that returned a valid output, else (its failed row, why): what
    :meth:`BatchingServer.run` answered for one row (``status`` ok / timeout / error, ``value``)."""
    if status != "ok":  # BatchingServer words a raised exception "<type>: <message>"
        bad = status == "error" and str(value).startswith(f"{AgentReturnError.__name__}: ")
        return failed_trajectory(prompt, "bad_return" if bad else _KIND_OF_STATUS.get(status, "exception")), \
            f"{status}: {value}"
    traj, problem = trajectory_from_output(value, budget, prompt_width)
    return (traj, None) if traj is not None else (failed_trajectory(prompt, "bad_return"), problem)


def row_trajectories(status: str, value: Any, prompt: list[int], budget: int, prompt_width: int,
                     several_rows: bool) -> tuple[list[Trajectory], Optional[str]]:
    """:func:`row_trajectory` of a loop that may return several rows (``several_rows``): a non-empty list
    of outputs gives one trajectory each; one invalid output fails the whole rollout (one failed row)."""
    if not (several_rows and status == "ok" and isinstance(value, list)):
        traj, problem = row_trajectory(status, value, prompt, budget, prompt_width)
        return [traj], problem
    if not value:
        return [failed_trajectory(prompt, "bad_return")], "returned an empty list of rows"
    trajs = []
    for k, output in enumerate(value):
        traj, problem = trajectory_from_output(output, budget, prompt_width)
        if traj is None:
            return [failed_trajectory(prompt, "bad_return")], f"row {k} of {len(value)}: {problem}"
        trajs.append(traj)
    return trajs, None


def run_agent_loops(names: list[str], row_kwargs: list[dict[str, Any]], prompts: list[list[int]],
                    server: BatchingServer, ctx: AgentLoopContext, budget: int,
                    prompt_width: int) -> list[list[Trajectory]]:
    """The trajectories of each row (one, or several under ``ctx.several_rows``): row i runs the loop
    registered as ``names[i]`` with ``row_kwargs[i]`` (its non-tensor columns); ``prompts[i]`` is the
    batch's prompt, kept for rows that fail. A loop's prompt may be at most ``prompt_width`` tokens (the
    batch's padded prompt width)."""
    loops: dict[int, Any] = {}
    progress = AgentProgress(len(names), ctx.progress_interval_s)

    def agent(row: int, name: str, kwargs: dict[str, Any]):
        async def body() -> Any:
            manager = LLMServerManager(server, row=row)
            loop = loops[row] = resolve_agent_loop(name, trainer_config=ctx.trainer_config, server_manager=manager,
                                                   tokenizer=ctx.tokenizer, processor=None, dataset_cls=None,
                                                   dataset_config=DictConfigWrap({}))
            return await loop.run(dict(ctx.sampling_params), **kwargs)
        return lambda: progress.track(body(), valid=lambda out: row_trajectories(
            "ok", out, [0], budget, prompt_width, ctx.several_rows)[1] is None)

    with progress:
        results = server.run([agent(i, n, k) for i, (n, k) in enumerate(zip(names, row_kwargs))], ctx.timeout_s)
    trajs, failures = [], defaultdict(list)
    for row, (name, prompt, (status, value)) in enumerate(zip(names, prompts, results)):
        row_trajs, problem = row_trajectories(status, value, prompt, budget, prompt_width, ctx.several_rows)
        if problem is not None:
            traj = row_trajs[0]
            failures[traj.failure].append(f"agent loop {name!r}: {problem}")
            calls = getattr(loops.get(row), "num_calls", None)
            if calls is not None:  # the model calls a failed agent made still count in agent/loop/calls
                traj.tool_metrics["loop/calls"] = float(calls)
        trajs.append(row_trajs)
    num_failed = sum(len(p) for p in failures.values())
    progress.finish(len(names) - num_failed, num_failed)
    log_failures(failures, len(names))
    return trajs


def log_failures(failures: dict[str, list[str]], num_rows: int) -> None:
    """One warning per failure kind that occurred: its count and its first row's reason."""
    for kind, problems in sorted(failures.items()):
        logger.warning("%d of %d agent-loop rows failed by %s (scored 0, counted in agent/ended_by/error and "
                       "agent/failure/%s); first: %s", len(problems), num_rows, kind, kind, problems[0])


def trajectory_from_output(output: Any, budget: int,
                           prompt_width: int) -> tuple[Optional[Trajectory], Optional[str]]:
    """(trajectory, None) from a loop's output, or (None, why it is invalid). Responses longer than
    ``budget`` are cut to it (as veRL); prompts longer than ``prompt_width`` are invalid."""
    if isinstance(output, dict):
        try:
            output = AgentLoopOutput.model_validate(output)
        except Exception as exc:
            return None, f"returned a mapping that is not an AgentLoopOutput ({str(exc)[:200]})"
    if not hasattr(output, "response_ids") or not hasattr(output, "prompt_ids"):
        return None, f"returned {type(output).__name__}, expected AgentLoopOutput"
    if getattr(output, "multi_modal_data", None):
        return None, "returned multi_modal_data; hybrid_rl's rollout is text-only"
    try:
        prompt, ids, mask = (list(map(int, getattr(output, k))) for k in ("prompt_ids", "response_ids", "response_mask"))
        log_probs = getattr(output, "response_logprobs", None)
        log_probs = None if log_probs is None else [float(x) for x in log_probs]
    except (TypeError, ValueError) as exc:
        return None, f"returned ids, mask or log-probs that are not numbers ({exc})"
    if len(mask) != len(ids) or (log_probs is not None and len(log_probs) != len(ids)):
        return None, (f"response_ids ({len(ids)}), response_mask ({len(mask)}) and response_logprobs "
                      f"({'-' if log_probs is None else len(log_probs)}) differ in length")
    if not prompt or len(prompt) > prompt_width:
        return None, (f"returned a prompt of {len(prompt)} tokens; it must have 1 to {prompt_width} "
                      "(data.max_prompt_length)")
    if any(m not in (0, 1) for m in mask):
        return None, "response_mask holds values other than 0 and 1"
    ids, mask = ids[:budget], mask[:budget]
    traj = Trajectory(prompt_ids=prompt)
    traj.extend(ids, 1, None)
    traj.response_mask = mask
    traj.log_probs = [lp if m else 0.0 for lp, m in zip(log_probs, mask)] if log_probs is not None else [0.0] * len(ids)
    segments = [m for k, m in enumerate(mask) if k == 0 or mask[k - 1] != m]
    traj.assistant_turns, traj.user_turns = segments.count(1), segments.count(0)
    extra = getattr(output, "extra_fields", None) or {}
    traj.tool_rewards = [v for v in map(finite_float, extra.get("tool_rewards") or []) if v is not None]
    traj.turn_scores = [v for v in map(finite_float, extra.get("turn_scores") or []) if v is not None]
    for key, raw in (getattr(output, "metrics", None) or {}).items():
        number = finite_float(raw)
        if number is not None:
            traj.tool_metrics[f"loop/{key}"] = number
    traj.reward_score = finite_float(getattr(output, "reward_score", None))
    traj.end_reason = "length" if len(ids) >= budget else "stop"
    return traj, None

