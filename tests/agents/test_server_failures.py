"""BatchingServer when an engine call raises: retried requests keep distinct seeds (the ones the
batched call gave them), and a dead engine is raised for the step, not hidden as per-row failures."""

import dataclasses
import random

import pytest

from hybrid_rl.agents.server import BatchingServer, TURN_SEED_STRIDE
from hybrid_rl.workers.rollout.base import GenerationParams

EOS = 2
POISON = 99
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=7, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=8)


def _agent(server, prompt, sampling=None):
    async def run():
        return (await server.generate(prompt, sampling)).token_ids
    return run


class VllmRuleEngine:
    """vLLM's rule: row i of a call samples with seed ``params.seed + i``; the 'sample' is that seed."""

    def __call__(self, token_lists, max_tokens, params):
        if any(POISON in t for t in token_lists):
            raise ValueError("poison token")
        return [([params.seed + i, EOS], None) for i in range(len(token_lists))]


class HfRuleEngine:
    """HF's / vLLM-CPU's rule: one stream per call seeded ``params.seed`` (row i takes its i-th draw,
    here ``100 * seed + i``); seed None continues the engine's private stream (a counter)."""

    def __init__(self):
        self.private = 0

    def __call__(self, token_lists, max_tokens, params):
        if any(POISON in t for t in token_lists):
            raise ValueError("poison token")
        out = []
        for i in range(len(token_lists)):
            if params.seed is None:
                self.private += 1
                out.append(([1000 + self.private, EOS], None))
            else:
                out.append(([100 * params.seed + i, EOS], None))
        return out


def _samples(engine, params, poison):
    server = BatchingServer(engine, params, max_model_len=32)
    agents = [_agent(server, [1, 2]) for _ in range(4)] + ([_agent(server, [POISON])] if poison else [])
    results = server.run(agents, timeout_s=5)
    assert all(status == "ok" for status, _ in results[:4])
    return [ids[0] for _, ids in results[:4]]


def test_retried_requests_keep_the_seeds_of_the_batched_call():
    # round 0 of a call seeded 7 samples with seed 7: rows 0..3 get 7, 8, 9, 10 on vLLM
    assert _samples(VllmRuleEngine(), PARAMS, poison=False) == [7, 8, 9, 10]
    # the poisoned request fails the batched call; each retried alone gets its row's seed back
    assert _samples(VllmRuleEngine(), PARAMS, poison=True) == [7, 8, 9, 10]


def test_retried_requests_of_one_prompt_differ_on_a_one_stream_per_call_engine():
    assert _samples(HfRuleEngine(), PARAMS, poison=False) == [700, 701, 702, 703]
    # retried alone, request i's call is seeded 7 + i: its first draw is 100 * (7 + i)
    assert _samples(HfRuleEngine(), PARAMS, poison=True) == [700, 800, 900, 1000]
    # no seed: each retry continues the private stream (the failed batched call drew nothing)
    assert _samples(HfRuleEngine(), dataclasses.replace(PARAMS, seed=None), poison=True) == [1001, 1002, 1003, 1004]


def test_a_later_round_retries_with_its_own_round_seed():
    calls = []

    def engine(token_lists, max_tokens, params):
        calls.append((len(token_lists), params.seed))
        if any(POISON in t for t in token_lists):
            raise ValueError("poison token")
        return [([params.seed + i, EOS], None) for i in range(len(token_lists))]

    server = BatchingServer(engine, PARAMS, max_model_len=32)

    def two_calls(prompt):
        async def run():
            await server.generate([1])
            return (await server.generate(prompt)).token_ids
        return run

    results = server.run([two_calls([3]), two_calls([POISON]), two_calls([4])], timeout_s=5)
    second = 7 + TURN_SEED_STRIDE
    assert results[0] == ("ok", [second, EOS]) and results[2] == ("ok", [second + 2, EOS])
    assert calls == [(3, 7), (3, second), (1, second), (1, second + 1), (1, second + 2)]


class DeadEngine:
    def __init__(self):
        self.calls = 0

    def __call__(self, token_lists, max_tokens, params):
        self.calls += 1
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_dead_engine_is_raised_for_the_step_whatever_the_agents_sent():
    engine = DeadEngine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access"):
        server.run([_agent(server, [1, 2], {"temperature": 0.7}) for _ in range(6)], timeout_s=5)
    assert engine.calls == 8  # the batched call, each of the 6 alone, then the probe: nothing served


def test_a_lone_failing_request_is_raised_when_the_engine_fails_a_probe_too():
    engine = DeadEngine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    with pytest.raises(RuntimeError, match="CUDA error"):
        server.run([_agent(server, [1, 2], {"temperature": 0.7})], timeout_s=5)
    assert engine.calls == 2  # the request, then the one-token probe with the rollout's settings


def test_several_requests_failing_each_for_its_own_reason_fail_only_their_agents():
    """Nothing served, but the engine answers the probe: each request's own failure, never the step's."""
    def engine(token_lists, max_tokens, params):
        if any(POISON in t for t in token_lists):
            raise ValueError("poison token")
        return [([5, EOS], None) for _ in token_lists]

    server = BatchingServer(engine, PARAMS, max_model_len=32)
    results = server.run([_agent(server, [POISON, 1]), _agent(server, [POISON, 2])], timeout_s=5)
    assert [status for status, _ in results] == ["error", "error"]
    assert all("answered a one-token probe" in message for _, message in results)


def test_a_lone_failing_request_fails_its_agent_when_the_engine_answers_the_probe():
    probes = []

    def engine(token_lists, max_tokens, params):
        if any(POISON in t for t in token_lists):
            raise ValueError("poison token")
        probes.append((token_lists, max_tokens, params))
        return [([5, EOS], None) for _ in token_lists]

    server = BatchingServer(engine, PARAMS, max_model_len=32)
    [(status, message)] = server.run([_agent(server, [POISON])], timeout_s=5)
    assert status == "error" and message == (
        "RequestFailed: the rollout engine failed on this request alone (ValueError: poison token); the engine "
        "answered a one-token probe with the rollout's own settings")
    assert probes == [([[0]], [1], PARAMS)]


def test_the_message_counts_the_round_requests_that_were_served():
    server = BatchingServer(VllmRuleEngine(), PARAMS, max_model_len=32)
    results = server.run([_agent(server, [1]), _agent(server, [POISON]), _agent(server, [3])], timeout_s=5)
    assert results[1] == ("error", "RequestFailed: the rollout engine failed on this request alone (ValueError: "
                                   "poison token); the round's other 2 request(s) were served")
