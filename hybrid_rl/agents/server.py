"""Request-level generation for agents that drive the model themselves, batched onto one engine.

Custom agent loops (:mod:`hybrid_rl.agents.agent_loop`), environments and black-box agents behind the
OpenAI-compatible endpoint each ask for one completion at a time (``await server.generate(...)``),
from many concurrent coroutines. The rollout engines are batched and synchronous: one call continues
many token lists. :class:`BatchingServer` joins the two:

* the agents run on a private event loop (a daemon thread); ``generate`` parks a request and awaits it;
* the calling thread (the rollout worker's, which owns the engine) collects the parked requests and
  serves them in *rounds*: a round starts once at least as many requests wait as agents are still
  running (every agent is waiting on the model), or, with ``batch_window_s`` set, that long after the
  first request waited (an agent busy with a slow tool then does not hold the others back, at the
  price of rounds that depend on timing);
* a round is one engine call per distinct sampling setting (usually one), its requests in (row, call
  number) order whatever order they arrived in; the r-th engine call of a rollout samples with seed
  ``s + r * TURN_SEED_STRIDE`` (as the built-in tool loop's turns). Runs whose agents all reach the
  model within the window are reproducible from the seed (agents that issue parallel calls aside).

Every agent is bounded by ``timeout_s`` and never raises into the rollout: its result is
``("ok", value)``, ``("error", message)`` or ``("timeout", message)``, as tools' are
(:mod:`hybrid_rl.agents.executor`). Nothing one agent sends fails the round: its sampling settings
are checked when it asks (:func:`~hybrid_rl.agents.request_checks.check_sampling`: the error is
raised into that agent only), and an engine call that raises is retried one request at a time, so a
request the engine fails on alone fails only its agent (:class:`RequestFailed`). Retried alone, a request
keeps the seed its row had in the batched call (vLLM's ``seed + row``), so samples stay distinct. A round
of which nothing could be served is the engine's failure, raised for the step: two or more requests
failing, or a lone one while the engine also fails a one-token probe with the rollout's own settings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

from hybrid_rl.agents.request_checks import InvalidParam, check_sampling

__all__ = ["BatchingServer", "LLMServerManager", "RequestFailed", "TokenOutput", "TURN_SEED_STRIDE"]

logger = logging.getLogger(__name__)

TURN_SEED_STRIDE = 10**12 + 39
"""Turn (round) t of a call seeded s samples with seed s + t * stride: far above the per-rank stride
(1_000_003) times any rank count and the per-row offsets on GPU, so no two (turn, rank, row) share a
seed. The built-in tool loop's turns use it too."""

TurnFn = Callable[[list[list[int]], list[int], Any], list[tuple[list[int], list[float]]]]
"""The engine's batched turn: (token lists, max new tokens per row, GenerationParams) -> (ids, log-probs)."""

_GRACE_S = 1.0
_SAMPLING_KEYS = ("temperature", "top_p", "top_k")
MIN_TEMPERATURE = 1e-2
"""A positive temperature below this samples at it (vLLM's rule): smaller ones overflow the logits."""


class RequestFailed(RuntimeError):
    """A request was not served: the engine failed on it (alone or with its round), or its rollout ended."""


@dataclass
class TokenOutput:
    """One completion (veRL's ``TokenOutput``): the sampled ids exactly as the engine produced them."""

    token_ids: list[int]
    log_probs: Optional[list[float]] = None
    """Per sampled token; None when the rollout does not compute them (``calculate_log_probs=false``)."""
    stop_reason: Optional[str] = None
    """``completed`` (ended with an EOS id) or ``length`` (hit max_tokens or the context length)."""


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    params: Any
    order: tuple = ()
    """(row, call number): the request's place in its round's engine call."""
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class BatchingServer:
    """Serves ``generate`` requests of concurrently running agents in batched engine rounds.

    Args:
        turn_fn: the engine's batched turn call.
        params: the call's GenerationParams (sampling settings, seed, EOS ids, response_length).
        max_model_len: longest prompt + completion a request may reach (prompt_length + response_length).
        batch_window_s: longest a waiting request waits for the other agents before its round starts;
            None = until every running agent waits (reproducible rounds).
    """

    def __init__(self, turn_fn: TurnFn, params: Any, max_model_len: int, batch_window_s: Optional[float] = None):
        self.turn_fn = turn_fn
        self.params = params
        self.max_model_len = int(max_model_len)
        self.batch_window_s = None if batch_window_s is None else float(batch_window_s)
        self.rounds = 0
        self.requests = 0
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._live = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    # ------------------------------------------------------------------ the agents' side (event loop)
    async def generate(self, prompt_ids: Sequence[int], sampling_params: Optional[dict] = None,
                       order: tuple = ()) -> TokenOutput:
        """One completion of ``prompt_ids`` (awaited by an agent running under :meth:`run`).

        ``sampling_params`` may set ``temperature``, ``top_p`` (0 or a temperature of 0 = greedy),
        ``top_k`` and ``max_tokens`` (or ``max_new_tokens``); others (``logprobs``,
        ``repetition_penalty`` ...) are ignored: log-probs come back whenever the rollout computes them.
        ``order``: the request's place in its round.
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt or min(prompt) < 0:
            raise InvalidParam("prompt_ids", f"prompt_ids must be a non-empty list of token ids >= 0, got "
                                             f"{prompt[:8]!r}. Fix: pass the tokenized prompt.")
        request = _Request(prompt, self._max_tokens(len(prompt), sampling_params or {}),
                           self._request_params(sampling_params or {}), tuple(order))
        if request.max_tokens <= 0:
            await asyncio.sleep(0)  # an agent retrying on empty output must not starve the loop
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="length")
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
        return await asyncio.wrap_future(request.future)

    def _max_tokens(self, prompt_len: int, sampling: dict) -> int:
        room = min(self.params.response_length, self.max_model_len - prompt_len)
        asked = sampling.get("max_tokens", sampling.get("max_new_tokens"))
        return room if asked is None else min(room, int(asked))

    def _request_params(self, sampling: dict) -> Any:
        check_sampling(sampling, where="sampling_params.")  # raised into this agent, not the round
        changes = {k: sampling[k] for k in _SAMPLING_KEYS if sampling.get(k) is not None}
        for key, cast in (("top_p", float), ("top_k", int)):
            if key in changes:
                changes[key] = cast(changes[key])
        if changes.get("top_k") == 0:  # vLLM's spelling of "no top-k cut"; the engines' is -1
            changes["top_k"] = -1
        if "temperature" in changes:
            changes["temperature"] = float(changes["temperature"])
        if changes.get("temperature", 1.0) <= 0 or changes.get("top_p") == 0:
            # greedy, as OpenAI reads temperature 0 and top_p 0 (only the most likely token left)
            changes.update(temperature=0.0, do_sample=False, top_p=1.0, top_k=-1)
        elif "temperature" in changes:  # a positive temperature samples on every engine (vLLM reads only it)
            changes.update(temperature=max(changes["temperature"], MIN_TEMPERATURE), do_sample=True)
        return dataclasses.replace(self.params, **changes) if changes else self.params

    # ------------------------------------------------------------------ the engine's side (calling thread)
    def run(self, agents: Sequence[Callable[[], Awaitable[Any]]], timeout_s: float) -> list[tuple[str, Any]]:
        """Run every agent (a zero-argument callable returning a coroutine) concurrently, serving their
        ``generate`` calls from this thread; one ``(status, value)`` per agent, in order."""
        if not agents:
            return []
        loop = self._loop = asyncio.new_event_loop()
        threading.Thread(target=_run_until_stopped, args=(loop,), name="hybrid_rl-agents", daemon=True).start()
        self._live = len(agents)
        futures = [asyncio.run_coroutine_threadsafe(self._bounded(agent, timeout_s), loop) for agent in agents]
        deadline = None if timeout_s <= 0 else time.monotonic() + timeout_s + _GRACE_S
        try:
            while self._serve_round(deadline):
                pass
        except BaseException:
            self._fail_pending("the rollout engine failed")
            concurrent.futures.wait(futures, timeout=_GRACE_S)
            loop.call_soon_threadsafe(loop.stop)
            raise
        finally:
            self._fail_pending("the agent's rollout ended")
        # an agent counts itself finished just before its future is set: give those futures their moment
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        concurrent.futures.wait(futures, timeout=remaining if self._live == 0 else 0.0)
        results = []
        for future in futures:
            if future.done():
                results.append(future.result())
            else:  # the agent blocked the event loop synchronously: leave the loop behind
                future.cancel()
                results.append(("timeout", f"no answer within {timeout_s:g} s (the agent blocked its event loop)"))
        if all(f.done() for f in futures):
            loop.call_soon_threadsafe(loop.stop)
        return results

    async def _bounded(self, agent: Callable[[], Awaitable[Any]], timeout_s: float) -> tuple[str, Any]:
        try:
            return "ok", await asyncio.wait_for(agent(), timeout=timeout_s if timeout_s > 0 else None)
        except asyncio.TimeoutError:
            return "timeout", f"no answer within {timeout_s:g} s"
        except BaseException as exc:  # untrusted agent code: any failure is the row's, never the step's
            return "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            with self._cond:
                self._live -= 1
                self._cond.notify_all()

    def _serve_round(self, deadline: Optional[float]) -> bool:
        """Wait for a round's requests and serve them; False once every agent has finished (or the
        deadline passed with agents still running)."""
        with self._cond:
            first_wait = None
            while True:
                waiting = [r for r in self._pending if not r.future.cancelled()]
                if self._live == 0 and not waiting:
                    return False
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    return False
                if waiting:
                    first_wait = first_wait or now
                    window = self.batch_window_s
                    if len(waiting) >= self._live or (window is not None and now - first_wait >= window):
                        break
                self._cond.wait(timeout=0.005 if waiting else 0.05)
            self._pending = []
        self._dispatch(waiting)
        return True

    def _dispatch(self, requests: list[_Request]) -> None:
        """Serve one round: one engine call per sampling setting, requests in (row, call) order. A request
        whose agent was cancelled meanwhile is skipped (its future can no longer be set). An engine call
        that raises is retried one request at a time (:meth:`_serve_group`); :meth:`_settle` then fails
        the requests the engine failed on alone, or raises when the engine itself is at fault."""
        groups: dict[Any, list[_Request]] = {}
        for request in sorted(requests, key=lambda r: r.order):
            if request.future.set_running_or_notify_cancel():  # running futures cannot be cancelled any more
                groups.setdefault(request.params, []).append(request)
        seed_base = self.params.seed
        failed: list[tuple[_Request, Exception]] = []  # (request, the engine's error on it alone)
        served = 0
        try:
            for params, group in groups.items():
                seed = None if seed_base is None else seed_base + self.rounds * TURN_SEED_STRIDE
                self.rounds += 1
                served += self._serve_group(group, dataclasses.replace(params, seed=seed), failed)
            if failed:
                self._settle(failed, served)
        except BaseException as exc:
            for group in groups.values():
                for request in group:
                    if not request.future.done():
                        request.future.set_exception(RequestFailed(f"the rollout engine failed: {exc!r}"))
            raise
        self.requests += len(requests)

    def _serve_group(self, group: list[_Request], params: Any, failed: list) -> int:
        """Serve ``group`` in one engine call, or one call per request if that raises; returns how many
        were served and appends the requests the engine failed on alone to ``failed``.

        Retried alone, the request at position i is seeded ``params.seed + i``: the seed vLLM gives row i
        of the batched call (so vLLM samples exactly what the batched call would have), and distinct
        streams on the one-stream-per-call engines (HF, vLLM-CPU). Without a seed each call continues
        the rollout's private stream, so the retries differ too."""
        try:
            self._answer(group, params)
            return len(group)
        except Exception as exc:
            if len(group) == 1:
                failed.append((group[0], exc))
                return 0
        served = 0
        for position, request in enumerate(group):
            seed = None if params.seed is None else params.seed + position
            try:
                self._answer([request], dataclasses.replace(params, seed=seed))
                served += 1
            except Exception as exc:
                failed.append((request, exc))
        return served

    def _answer(self, group: list[_Request], params: Any) -> None:
        outputs = list(self.turn_fn([r.prompt_ids for r in group], [r.max_tokens for r in group], params))
        if len(outputs) != len(group):
            raise RuntimeError(f"the engine returned {len(outputs)} completions for {len(group)} prompts")
        for request, (ids, log_probs) in zip(group, outputs):
            ids = list(ids)[: request.max_tokens]
            ended = bool(ids) and ids[-1] in params.eos_token_ids
            request.future.set_result(TokenOutput(
                token_ids=ids, log_probs=list(log_probs)[: len(ids)] if log_probs else None,
                stop_reason="completed" if ended else "length"))

    def _settle(self, failed: list[tuple[_Request, Exception]], served: int) -> None:
        """Fail the requests the engine failed on alone; raise when the engine itself is at fault."""
        if served == 0:
            self._raise_if_engine_failed(failed)
        why = (f"the round's other {served} request(s) were served" if served else
               "the engine answered a one-token probe with the rollout's own settings")
        for request, exc in failed:
            request.future.set_exception(RequestFailed(
                f"the rollout engine failed on this request alone ({type(exc).__name__}: {str(exc)[:200]}); {why}"))
        request, exc = failed[0]
        logger.warning("%d request(s) of a round failed in the engine alone; only their agents fail (first: "
                       "call %s, %s: %s)", len(failed), request.order, type(exc).__name__, str(exc)[:200])

    def _raise_if_engine_failed(self, failed: list[tuple[_Request, Exception]]) -> None:
        """No request of the round was served: the engine is at fault when it also fails a one-token
        probe (prompt ``[0]``) with the rollout's own settings; then the first request's error is raised
        (``_dispatch`` fails the rest). Otherwise each request failed for a reason of its own (a row's
        failure, never the step's), however many there were."""
        try:
            self.turn_fn([[0]], [1], self.params)
            return
        except Exception as probe_error:  # noqa: BLE001 - any engine failure
            logger.error("the rollout engine failed a one-token probe with the rollout's own settings (%s: %s); "
                         "it served none of the %d request(s) of a round: raising for the step",
                         type(probe_error).__name__, str(probe_error)[:200], len(failed))
        raise failed[0][1]

    def _fail_pending(self, why: str) -> None:
        with self._cond:
            pending, self._pending = self._pending, []
        for request in pending:
            if not request.future.done():
                request.future.set_exception(RequestFailed(why))


def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """The agents' loop thread: run until stopped, then close the loop (its selector's file descriptors
    would otherwise leak, one set per rollout call)."""
    try:
        loop.run_forever()
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()


class LLMServerManager:
    """What an agent loop calls the model through (veRL's ``AsyncLLMServerManager``):
    ``await server_manager.generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput``.
    ``request_id`` is accepted for veRL's signature (sticky sessions across servers); one rollout
    worker has one engine, so it does not route anything. One manager per row (``row``): its calls
    take their place in a round by (row, call number)."""

    def __init__(self, server: BatchingServer, row: int = 0):
        self.server = server
        self.row = row
        self.calls = 0

    async def generate(self, request_id: Any = None, *, prompt_ids: Sequence[int],
                       sampling_params: Optional[dict] = None, image_data: Any = None,
                       video_data: Any = None) -> TokenOutput:
        if image_data or video_data:
            raise ValueError("image_data / video_data: hybrid_rl's rollout is text-only. Fix: pass token ids only.")
        self.calls += 1
        return await self.server.generate(prompt_ids, sampling_params, order=(self.row, self.calls))
