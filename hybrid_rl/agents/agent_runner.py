"""Running custom agent loops for a batch of rows and turning their outputs into trajectories.

Each row runs its loop as a coroutine under a :class:`BatchingServer` (the engine serves all rows'
model calls in batched rounds). A loop that raises, runs past ``agent.timeout_s`` or returns something
that is not a valid :class:`AgentLoopOutput` never fails the step: its row gets an empty response, a
score of 0 (``reward_score``) and ``end_reason="error"``, counted in ``agent/ended_by/error``; the
first failure of a step is logged with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from hybrid_rl.agents.agent_loop import AgentLoopOutput, DictConfigWrap, resolve_agent_loop
from hybrid_rl.agents.loop import Trajectory
from hybrid_rl.agents.server import BatchingServer, LLMServerManager
from hybrid_rl.reward.guard import finite_float

__all__ = ["AgentLoopContext", "run_agent_loops", "trajectory_from_output"]

logger = logging.getLogger(__name__)


@dataclass
class AgentLoopContext:
    """What every loop instance of a call is built with."""

    trainer_config: DictConfigWrap
    tokenizer: Any
    sampling_params: dict[str, Any]
    """veRL's per-call sampling settings: temperature, top_p, top_k, repetition_penalty, logprobs."""
    timeout_s: float
    """Bound of one row's whole loop (``agent.timeout_s``)."""


def run_agent_loops(names: list[str], row_kwargs: list[dict[str, Any]], prompts: list[list[int]],
                    server: BatchingServer, ctx: AgentLoopContext, budget: int, prompt_width: int) -> list[Trajectory]:
    """One trajectory per row: row i runs the loop registered as ``names[i]`` with ``row_kwargs[i]``
    (its non-tensor columns); ``prompts[i]`` is the batch's prompt, kept for rows that fail. A loop's
    prompt may be at most ``prompt_width`` tokens (the batch's padded prompt width)."""
    def agent(row: int, name: str, kwargs: dict[str, Any]):
        async def run() -> Any:
            manager = LLMServerManager(server, row=row)
            loop = resolve_agent_loop(name, trainer_config=ctx.trainer_config, server_manager=manager,
                                      tokenizer=ctx.tokenizer, processor=None, dataset_cls=None,
                                      dataset_config=DictConfigWrap({}))
            return await loop.run(dict(ctx.sampling_params), **kwargs)
        return run

    results = server.run([agent(i, n, k) for i, (n, k) in enumerate(zip(names, row_kwargs))], ctx.timeout_s)
    trajs, failures = [], []
    for name, prompt, (status, value) in zip(names, prompts, results):
        traj, problem = (trajectory_from_output(value, budget, prompt_width) if status == "ok"
                         else (None, f"{status}: {value}"))
        if traj is None:
            failures.append(f"agent loop {name!r}: {problem}")
            traj = Trajectory(prompt_ids=list(prompt), end_reason="error", reward_score=0.0)
        trajs.append(traj)
    if failures:
        logger.warning("%d of %d agent-loop rows failed (scored 0, counted in agent/ended_by/error); first: %s",
                       len(failures), len(names), failures[0])
    return trajs


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

