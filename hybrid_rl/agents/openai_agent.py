"""``OpenAIAgentLoop``: train a black-box agent that talks to the policy through OpenAI's API.

The agent is any ``async def agent(client: openai.AsyncOpenAI, row: dict) -> float | dict | None``,
named by its dotted path in an agent-loop YAML entry::

    - name: calculator_openai                      # rows with agent_name: calculator_openai
      _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop
      agent: my_agents.calculator.solve            # importable in the rollout workers

For each row the loop opens a trajectory on this process's endpoint
(:class:`hybrid_rl.agents.openai_server.OpenAIEndpoint`), gives the agent a client whose base URL
names that trajectory, and awaits it (bounded by ``agent.timeout_s``, like every agent loop). The agent
may call the model as often as it likes, in parallel, branch or run sub-agents; every call's prompt
ids, sampled ids and log-probs are recorded exactly.

**From calls to the training row.** A call whose messages continue an earlier call (that call's
messages, its reply, then new messages) *extends* it and shares its ids. The row is the longest chain
of extensions (most calls, then most sampled tokens, then the one requested last): the first call's
prompt, then each call's sampled ids (mask 1) and, between them, the ids the next call added (tool
results, user turns: mask 0). Calls off that chain (an independent sub-agent, a judge call, a
discarded branch) are not trained on; they are counted in ``agent/loop/calls_off_row``. (One row per prompt keeps GRPO's groups and the trainer's batch sizes as
they are.) With ``agent.rows: every_call`` the loop returns :func:`rows_from_calls`' list instead:
every call's tokens in exactly one row, each row with the rollout's score (docs/agents.md).

**Scores.** A number returned is the row's score; a dict's ``reward`` (or ``score``) is, and its other
numeric values are reported as ``agent/loop/<key>``; ``None`` leaves the score to the reward function
(which then scores the decoded trajectory). An agent that raises, times out, returns anything else or
never calls the model gives its row an empty response scored 0 (``agent/ended_by/error``, its kind in
``agent/failure/<kind>``); the calls it made still count in ``agent/loop/calls``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from hybrid_rl.agents.agent_loop import AgentLoopBase, AgentLoopOutput
from hybrid_rl.agents.agent_runner import AgentReturnError
from hybrid_rl.agents.openai_server import CallRecord, get_endpoint
from hybrid_rl.agents.tool import import_object
from hybrid_rl.reward.guard import finite_float

__all__ = ["OpenAIAgentLoop", "output_from_calls", "rows_from_calls"]


def _import_agent(path: str) -> Callable:
    fix = "Fix: set agent: to the dotted path of an async def agent(client, row), importable in the rollout workers"
    try:
        fn = import_object(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"OpenAIAgentLoop agent={path!r}: cannot import it ({type(exc).__name__}: {exc}). {fix}.") from None
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"OpenAIAgentLoop agent={path!r} is not an async function. {fix}.")
    return fn


class OpenAIAgentLoop(AgentLoopBase):
    """Runs a black-box agent per row over the OpenAI-compatible endpoint (see the module docstring).

    Args:
        agent: dotted path of ``async def agent(client, row)``.
        client_timeout_s: the client's HTTP timeout per call (the whole row is bounded by
            ``agent.timeout_s``).
    """

    def __init__(self, *args: Any, agent: str, client_timeout_s: float = 600.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.agent = _import_agent(agent)
        self.client_timeout_s = float(client_timeout_s)
        self.num_calls: Optional[int] = None  # the row's model calls, set when its agent ends (failed or not)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        import httpx
        import openai

        endpoint = get_endpoint(self.tokenizer)
        rollout = self.config.actor_rollout_ref.rollout
        key = endpoint.open(self.server_manager, sampling_params, budget=int(rollout.response_length),
                            tool_format=rollout.multi_turn.format)
        client = openai.AsyncOpenAI(  # trust_env=False: loopback calls never go through an HTTP(S)_PROXY
            base_url=endpoint.base_url(key), api_key="hybrid-rl", max_retries=0, timeout=self.client_timeout_s,
            http_client=httpx.AsyncClient(trust_env=False, timeout=self.client_timeout_s))
        row = {k: v.tolist() if hasattr(v, "tolist") and not isinstance(v, (str, bytes)) else v for k, v in kwargs.items()}
        try:
            result = await self.agent(client, row)
        finally:  # also when the agent raised or timed out: its calls still count in agent/loop/calls
            calls = endpoint.close(key)
            self.num_calls = len(calls)
            await client.close()
        if rollout.agent.rows == "every_call":
            return rows_from_calls(calls, result)
        return output_from_calls(calls, result)


def _score(result: Any) -> tuple[Optional[float], dict[str, float]]:
    """(row score or None, metrics) from an agent's return value; ValueError when it is not usable."""
    if result is None:
        return None, {}
    if isinstance(result, dict):
        raw = result.get("reward", result.get("score"))
        metrics = {k: v for k, v in ((k, finite_float(v)) for k, v in result.items() if k not in ("reward", "score"))
                   if v is not None}
        score = finite_float(raw) if raw is not None else None
        if raw is not None and score is None:
            raise AgentReturnError(f"the agent returned reward={str(raw)[:40]}, not a finite number")
        return score, metrics
    score = finite_float(result) if not isinstance(result, (str, bytes)) else None
    if score is None:
        raise AgentReturnError(f"the agent returned {type(result).__name__} {str(result)[:40]!r}; expected a number, "
                         "a dict with 'reward', or None")
    return score, {}


def _longest(calls: list[CallRecord], chains: list[list[int]]) -> list[int]:
    """The chain (call indices) with the most calls, then the most sampled tokens, then requested last."""
    return max(chains, key=lambda c: (len(c), sum(len(calls[i].completion_ids) for i in c), calls[c[-1]].started))


def _row(chain: list[CallRecord], score: Optional[float], metrics: dict[str, float]) -> AgentLoopOutput:
    """A chain of continued calls as one row: the first call's prompt, each call's sampled ids (mask 1) and,
    between them, the ids the next call added (mask 0)."""
    ids: list[int] = []
    mask: list[int] = []
    log_probs: list[float] = []
    previous = None
    for call in chain:
        if previous is not None:
            inserted = call.prompt_ids[len(previous.prompt_ids) + len(previous.completion_ids):]
            ids, mask, log_probs = ids + inserted, mask + [0] * len(inserted), log_probs + [0.0] * len(inserted)
        ids += call.completion_ids
        mask += [1] * len(call.completion_ids)
        log_probs += call.log_probs if call.log_probs is not None else [0.0] * len(call.completion_ids)
        previous = call
    return AgentLoopOutput(prompt_ids=chain[0].prompt_ids, response_ids=ids, response_mask=mask,
                           response_logprobs=log_probs, reward_score=score, num_turns=2 * len(chain) + 1,
                           metrics=metrics)


def output_from_calls(calls: list[CallRecord], result: Any) -> AgentLoopOutput:
    """The row of a finished agent: its longest chain of continued calls (module docstring)."""
    if not calls:
        raise AgentReturnError("the agent never called the model")
    score, metrics = _score(result)
    chain = _longest(calls, [_indices(calls, i) for i in range(len(calls))])
    metrics.update(calls=float(len(calls)), calls_off_row=float(len(calls) - len(chain)))
    return _row([calls[i] for i in chain], score, metrics)


def _indices(calls: list[CallRecord], last: int) -> list[int]:
    """The indices of the calls from the first one of ``last``'s chain to ``last``, in order."""
    chain, index = [], last
    while index is not None:
        chain.append(index)
        index = calls[index].parent
    return chain[::-1]


def rows_from_calls(calls: list[CallRecord], result: Any) -> list[AgentLoopOutput]:
    """Every call's tokens as training rows (``agent.rows: every_call``, docs/harness_plan.md item 2): each
    call that continues no earlier call roots a row, its longest chain of continuations (the chain mode's
    rule, per root); a call on a branch left out of its parent's row roots a row of its own (its prompt is
    its full prompt ids, the parent's tokens included as context). Every sampled token is in exactly one
    row; every row carries the rollout's score and metrics (``rows``: how many rows the rollout gave)."""
    if not calls:
        raise AgentReturnError("the agent never called the model")
    score, metrics = _score(result)
    children: dict[Optional[int], list[int]] = {}
    for index, call in enumerate(calls):
        children.setdefault(call.parent, []).append(index)
    covered: set[int] = set()
    chains = []
    for start in sorted(range(len(calls)), key=lambda i: calls[i].started):  # a parent starts before its children
        if start not in covered:
            chain = _longest(calls, _paths(children, start, covered))
            covered.update(chain)
            chains.append(chain)
    metrics.update(calls=float(len(calls)), calls_off_row=0.0, rows=float(len(chains)))
    return [_row([calls[i] for i in chain], score, dict(metrics)) for chain in chains]


def _paths(children: dict[Optional[int], list[int]], start: int, covered: set[int]) -> list[list[int]]:
    """Every path from ``start`` down its not yet covered continuations."""
    below = [c for c in children.get(start, []) if c not in covered]
    return [[start]] if not below else [[start] + path for c in below for path in _paths(children, c, covered)]
