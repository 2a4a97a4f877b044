"""Streaming agent rows (environments, custom agent loops) with partial rollout.

A streamed agent row is a coroutine: its registered agent loop (``@register`` or the agent-loop YAML,
e.g. :class:`~hybrid_rl.agents.env_loop.EnvAgentLoop`) runs on one private event loop (a daemon
thread) and asks the model for each turn through ``await server_manager.generate(...)``. Unlike the
batch path (:class:`~hybrid_rl.agents.server.BatchingServer` rounds, where every agent waits for the
round), each parked turn becomes a token-level request of the engine's own :class:`Streamer` (the HF
segment loop or vLLM continuous batching) the next time :meth:`AgentStreamer.step` runs, so:

* every row advances on its own: a slow environment step of one episode holds no other row;
* a finished row is returned at once, and rows submitted later join while others run;
* a weight update interrupts the model turns in flight exactly as for single-turn rows (their
  tokens kept with the versions and log-probs that sampled them) and they continue with the new
  weights; a row whose agent is inside its environment is not touched.

A finished row comes back as a :class:`StreamSample` whose ``response_ids`` hold the whole
trajectory (model turns and observations, the batch path's layout, docs/agents.md); ``versions`` is
the version that sampled each model token and -1 on observation tokens; ``finish_reason`` is the
trajectory's end reason; ``meta["trajectory"]`` carries ``response_mask``, ``num_turns``,
``tool_rewards``, ``turn_scores``, ``agent_metrics``, ``reward_score`` and ``prompt_width``.

Rows of the built-in tool loop (``tool_agent`` / ``single_turn_agent``, ``multi_turn.enable``) stream
too: the loop (:class:`~hybrid_rl.agents.loop.AgentLoop`, written as batched rounds) runs for that one
row on a worker thread of its own, and each of its rounds (one model turn) becomes a parked request of
the same server, so a row's tool calls and interaction replies hold no other row. A row's request ``meta["row"]`` holds its
non-tensor columns (``raw_prompt``, ``extra_info``, ``agent_name`` ...), as a custom loop's ``run``
receives them. Randomness: every turn samples from the rollout's private stream (no per-call seed),
so a streamed sampled run is not reproducible from the seed; greedy rows are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import torch

from hybrid_rl.agents.agent_loop import BUILTIN_AGENT_LOOPS, DictConfigWrap, resolve_agent_loop
from hybrid_rl.agents.agent_runner import row_trajectory
from hybrid_rl.agents.loop import AgentLoop, Trajectory
from hybrid_rl.agents.server import BatchingServer, LLMServerManager, TokenOutput, _run_until_stopped
from hybrid_rl.workers.rollout.multi_turn import (_object_column, _row_metrics, check_agent_name,
                                                  rollout_config_tree, row_contexts, verl_sampling_params)
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.streaming import (PartialRequest, StreamRequest, StreamSample, Streamer,
                                                 check_stream_requests)

if TYPE_CHECKING:
    from hybrid_rl.workers.rollout.base import BaseRollout

__all__ = ["AgentStreamer"]

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.005
"""Longest nap of :meth:`AgentStreamer.step` while every live row waits on its environment."""


@dataclass
class _Row:
    """One submitted agent row: its request, the running coroutine's future, and the versions of
    the model tokens its turns returned (in order)."""

    request: StreamRequest
    future: Any
    versions: list[int] = field(default_factory=list)


class AgentStreamer:
    """The streaming loop of an engine whose rows run through agent loops (module docstring).

    ``inner`` is the engine's own :class:`Streamer`: it serves the turns token by token. Call it from
    one thread (the Ray actor's); the agents run on the event-loop thread.
    """

    def __init__(self, rollout: "BaseRollout", inner: Streamer):
        self.rollout, self.inner = rollout, inner
        self.rows: dict[str, _Row] = {}
        self._serials: dict[int, str] = {}  # server row number -> request id
        self._turns: dict[str, tuple[str, Any]] = {}  # turn id -> (row id, the parked request)
        self._servers: dict[GenerationParams, BatchingServer] = {}
        self._cond = threading.Condition()  # shared by every server: a parked turn or a finished row wakes step
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._next = 0

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def in_flight(self) -> dict[str, _Row]:
        return self.rows

    # ------------------------------------------------------------------ submitting rows
    def submit(self, requests: Sequence[StreamRequest], params: GenerationParams) -> None:
        check_stream_requests(self.rollout, requests, self.rows, agents=True)
        names = [self._agent_name(req) for req in requests]
        server = self._server(params)
        for req, name in zip(requests, names):
            copy = StreamRequest(req.request_id, [int(t) for t in req.prompt_ids], int(req.max_tokens), dict(req.meta))
            serial, self._next = self._next, self._next + 1
            self._serials[serial] = copy.request_id
            with self._cond:
                server._live += 1
            run = (self._builtin if name in BUILTIN_AGENT_LOOPS else self._agent)(server, serial, name, copy)
            coro = server._bounded(run, self.rollout.config.agent.timeout_s)
            self.rows[copy.request_id] = _Row(copy, asyncio.run_coroutine_threadsafe(coro, self._event_loop()))

    def _agent_name(self, req: StreamRequest) -> str:
        row = req.meta.get("row") if isinstance(req.meta.get("row"), dict) else {}
        name = row.get("agent_name")
        name = str(name) if isinstance(name, str) and name else self.rollout.multi_turn.default_agent
        check_agent_name(name, f"stream_submit: request {req.request_id!r} agent_name")
        return name

    def _server(self, params: GenerationParams) -> BatchingServer:
        params = dataclasses.replace(params, seed=None)  # streamed turns draw from the private stream
        if params not in self._servers:
            cfg = self.rollout.config
            server = BatchingServer(None, params, max_model_len=cfg.prompt_length + cfg.response_length)
            server._cond = self._cond
            self._servers[params] = server
        return self._servers[params]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=_run_until_stopped, args=(self._loop,), name="hybrid_rl-agent-stream",
                             daemon=True).start()
        return self._loop

    def _agent(self, server: BatchingServer, serial: int, name: str, req: StreamRequest):
        generator, cfg = self.rollout.multi_turn, self.rollout.config
        kwargs = dict(req.meta.get("row") or {})
        info = kwargs.get("extra_info") if isinstance(kwargs.get("extra_info"), dict) else {}
        for key in ("tools_kwargs", "interaction_kwargs"):
            kwargs.setdefault(key, info.get(key) or {})
        sampling = verl_sampling_params(server.params, cfg.calculate_log_probs)

        async def run() -> Any:
            loop = resolve_agent_loop(name, trainer_config=DictConfigWrap(rollout_config_tree(cfg)),
                                      server_manager=LLMServerManager(server, row=serial),
                                      tokenizer=generator.tokenizer, processor=None, dataset_cls=None,
                                      dataset_config=DictConfigWrap({}))
            return await loop.run(dict(sampling), **kwargs)
        return run

    def _builtin(self, server: BatchingServer, serial: int, name: str, req: StreamRequest):
        """One row of the built-in tool loop: :class:`AgentLoop` runs it alone on a worker thread; each
        round's model turn is parked on ``server`` (served by :meth:`step`) and awaited by that thread."""
        generator = self.rollout.multi_turn
        row = dict(req.meta.get("row") or {})
        context = row_contexts({k: _object_column([v]) for k, v in row.items()}, 1)[0]
        context.agent_name = name
        sampling = verl_sampling_params(server.params, self.rollout.config.calculate_log_probs)
        agent = AgentLoop(generator.config.multi_turn, generator.tokenizer, generator.tools, generator.interactions,
                          list(server.params.eos_token_ids))  # a row's own loop: its tool runner is not shared

        async def run() -> Trajectory:
            loop, gone = asyncio.get_running_loop(), threading.Event()

            def turn(token_lists: list[list[int]], max_tokens: list[int], index: int) -> list[tuple[list[int], list]]:
                if gone.is_set():  # the row timed out while its tools ran: stop before another turn
                    raise TimeoutError(f"streamed row {req.request_id!r} ran past rollout.agent.timeout_s")
                ask = server.generate(token_lists[0], {**sampling, "max_tokens": max_tokens[0]}, order=(serial, index))
                out = asyncio.run_coroutine_threadsafe(ask, loop).result()
                return [(list(out.token_ids), list(out.log_probs or []))]

            done = loop.create_future()

            def work() -> None:  # a daemon thread: a row stuck on a turn never holds the process at exit
                try:
                    outcome = (agent.run([list(req.prompt_ids)], [context], turn, int(req.max_tokens))[0], None)
                except BaseException as exc:  # noqa: BLE001 - handed to the row's coroutine
                    outcome = (None, exc)
                try:
                    loop.call_soon_threadsafe(_settle, done, *outcome)
                except RuntimeError:  # the event loop is gone (the engine shut down)
                    pass

            threading.Thread(target=work, name=f"hybrid_rl-tool-row-{serial}", daemon=True).start()
            try:
                return await done
            except asyncio.CancelledError:
                gone.set()
                raise
        return run

    def pending(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ advancing
    def step(self, max_wall_s: float) -> list[StreamSample]:
        """Advance until at least one row finished or ``max_wall_s`` passed; when every live row waits
        on its environment, nap in short waits (never past ``max_wall_s``). Returns the finished rows."""
        if not max_wall_s >= 0:
            raise ValueError(f"stream_step: max_wall_s={max_wall_s!r} is invalid: it is a time budget. "
                             "Fix: pass a non-negative number of seconds.")
        deadline = time.monotonic() + max_wall_s
        while True:
            self._start_turns()
            finished = self._collect_rows()
            if finished or not self.rows:
                return finished
            if self.inner.in_flight:
                self.rollout.check_ready()
                for sample in self.inner.advance():
                    self._answer(sample)
            else:
                with self._cond:
                    if not self._parked():
                        self._cond.wait(max(0.0, min(_IDLE_WAIT_S, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return self._collect_rows()

    def _parked(self) -> bool:
        return any(server._pending for server in self._servers.values())

    def _start_turns(self) -> None:
        """Parked turn requests become token-level requests of the inner streamer."""
        with self._cond:
            parked = [(s, r) for s in self._servers.values() for r in s._pending]
            for server in self._servers.values():
                server._pending = []
        for server, request in parked:
            if not request.future.set_running_or_notify_cancel():
                continue  # its agent was cancelled (timed out) meanwhile
            rid = self._serials[request.order[0]]
            turn_id = f"{rid}#turn{request.order[1]}"
            self._turns[turn_id] = (rid, request)
            turn = StreamRequest(turn_id, list(request.prompt_ids), int(request.max_tokens), {})
            self.inner.in_flight[turn_id] = PartialRequest(turn, dataclasses.replace(request.params, seed=None))

    def _answer(self, sample: StreamSample) -> None:
        """A finished turn: its tokens and log-probs go back to the agent, its versions to the row."""
        rid, request = self._turns.pop(sample.request_id)
        row = self.rows.get(rid)
        if row is not None:
            row.versions.extend(sample.versions)
        if not request.future.done():
            request.future.set_result(TokenOutput(
                token_ids=list(sample.response_ids), log_probs=list(sample.log_probs),
                stop_reason="completed" if sample.finish_reason == "stop" else "length"))

    def _collect_rows(self) -> list[StreamSample]:
        """Remove and return the rows whose agent returned, in submission order."""
        done = [rid for rid, row in self.rows.items() if row.future.done()]
        return [self._to_sample(self.rows.pop(rid)) for rid in done]

    def _to_sample(self, row: _Row) -> StreamSample:
        cfg, req = self.rollout.config, row.request
        width = max(cfg.prompt_length, len(req.prompt_ids))
        status, value = row.future.result()
        if status == "ok" and isinstance(value, Trajectory):  # a built-in tool-loop row
            traj, problem = value, None
        else:
            traj, problem = row_trajectory(status, value, req.prompt_ids, req.max_tokens, width)
        if problem is not None:
            logger.warning("streamed agent row %r failed by %s (scored 0, counted in agent/ended_by/error): %s",
                           req.request_id, traj.failure, problem)
        meta = dict(req.meta)
        meta["trajectory"] = {"failure": traj.failure, "response_mask": list(traj.response_mask),
                              "num_turns": traj.num_turns,
                              "tool_rewards": list(traj.tool_rewards), "turn_scores": list(traj.turn_scores),
                              "agent_metrics": _row_metrics(traj), "reward_score": traj.reward_score,
                              "prompt_width": width}
        return StreamSample(req.request_id, list(traj.prompt_ids), list(traj.response_ids), list(traj.log_probs),
                            token_versions(traj.response_mask, row.versions, self.version),
                            str(traj.end_reason), meta)

    # ------------------------------------------------------------------ weights, state
    def interrupt(self) -> None:
        self.inner.interrupt()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Interrupt the model turns in flight, load, tag later tokens with ``version``."""
        self.inner.update_weights(named_tensors, version)

    def load(self, load: Callable[[], None], version: int) -> None:
        """:meth:`update_weights` with the engine's own load (``Streamer.load``)."""
        self.inner.load(load, version)

    def set_version(self, version: int) -> None:
        self.inner.set_version(version)

    def state(self) -> dict:
        """The current version and the rows in flight as their original requests: a running agent
        (its environment included) cannot be saved, so a restored row starts its episode again."""
        return {"version": self.version, "requests": [], "agent_rows": [dataclasses.asdict(r.request)
                                                                         for r in self.rows.values()],
                "params": [dataclasses.asdict(s.params) for s in self._servers.values()][:1]}

    def restore(self, state: dict) -> None:
        if self.rows:
            raise ValueError(f"stream_restore: {len(self.rows)} requests are in flight. Fix: restore into an idle "
                             "engine (stream_pending() == 0), e.g. right after it is built.")
        self.inner.restore({"version": state["version"], "requests": state.get("requests", [])})
        rows = state.get("agent_rows") or []
        if rows:
            p = state["params"][0]
            params = GenerationParams(**dict(p, eos_token_ids=tuple(p["eos_token_ids"])))
            self.submit([StreamRequest(**r) for r in rows], params)


def _settle(future: "asyncio.Future", value: Any, error: Optional[BaseException]) -> None:
    """Complete a built-in row's future on its event loop (unless its coroutine was cancelled meanwhile)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def token_versions(mask: Sequence[int], turn_versions: Sequence[int], fallback: int) -> list[int]:
    """Per response token: the version that sampled it (mask 1), -1 on observations (mask 0).

    The model tokens of a trajectory are its turns' tokens in order, so they take the turns'
    versions in order. A loop that returned a different number of model tokens than it was served
    (it re-tokenized or cut them) gets its oldest served version on every model token (``fallback``,
    the engine's current version, if it was served none): the staleness rule reads the oldest token.
    """
    model_tokens = sum(1 for m in mask if m)
    if model_tokens == len(turn_versions):
        served = iter(turn_versions)
        return [next(served) if m else -1 for m in mask]
    oldest = min(turn_versions) if turn_versions else fallback
    return [oldest if m else -1 for m in mask]
