"""What one agent sends never fails the round: each call's parameters are checked on their own
(request_checks.py), and a request the engine fails on alone fails only its agent (server.py)."""

import dataclasses
import math

import pytest

from hybrid_rl.agents.request_checks import InvalidParam, check_openai_body, check_prompt_ids
from hybrid_rl.agents.server import BatchingServer
from hybrid_rl.workers.rollout.base import GenerationParams

EOS = 2
PARAMS = GenerationParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=7, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=8)
NAN = float("nan")

BAD_BODIES = [  # (kind, body, the param named, a piece of the message)
    ("chat", {"temperature": NAN}, "temperature", "temperature=nan is invalid: must be a finite number >= 0"),
    ("chat", {"temperature": float("inf")}, "temperature", "temperature=inf is invalid"),
    ("chat", {"temperature": -0.5}, "temperature", "temperature=-0.5 is invalid"),
    ("chat", {"temperature": "hot"}, "temperature", "temperature='hot' is invalid"),
    ("chat", {"top_p": -1}, "top_p", "top_p=-1 is invalid: must be a number in [0, 1] (0 = greedy, 1 = no nucleus "
                                     "cut). Fix: send a top_p in [0, 1], or leave it out to use the rollout's."),
    ("chat", {"top_p": -1e-9}, "top_p", "top_p=-1e-09 is invalid"),
    ("chat", {"top_p": NAN}, "top_p", "top_p=nan is invalid"),
    ("completions", {"top_p": 1.5}, "top_p", "top_p=1.5 is invalid"),
    ("chat", {"top_k": -2}, "top_k", "top_k=-2 is invalid: must be an integer >= -1 (-1 or 0 = no top-k cut)"),
    ("chat", {"top_k": 2.5}, "top_k", "top_k=2.5 is invalid"),
    ("chat", {"top_k": True}, "top_k", "top_k=True is invalid"),
    ("chat", {"max_tokens": 0}, "max_tokens", "max_tokens=0 is invalid: must be an integer >= 1"),
    ("completions", {"max_tokens": -3}, "max_tokens", "max_tokens=-3 is invalid"),
    ("chat", {"max_completion_tokens": 1.5}, "max_completion_tokens", "max_completion_tokens=1.5 is invalid"),
    ("chat", {"n": 2}, "n", "n=2 is invalid: n must be 1 (each sample is its own call)"),
    ("chat", {"stream": True}, "stream", "stream=true is not supported"),
    ("chat", {"logprobs": "yes"}, "logprobs", "logprobs='yes' is invalid: must be true or false"),
    ("completions", {"logprobs": 6}, "logprobs", "logprobs=6 is invalid: must be an integer in [0, 5]"),
    ("chat", {"top_logprobs": 21}, "top_logprobs", "top_logprobs=21 is invalid: must be an integer in [0, 20]"),
    ("chat", {"stop": 5}, "stop", "stop=5 is invalid: must be a string or a list of at most 4 strings"),
    ("completions", {"stop": ["a"] * 5}, "stop", "is invalid: must be a string or a list of at most 4"),
    ("chat", {"presence_penalty": 3}, "presence_penalty", "presence_penalty=3 is invalid: must be a number in [-2, 2]"),
    ("chat", {"seed": "x"}, "seed", "seed='x' is invalid: must be an integer"),
]


@pytest.mark.parametrize("kind,body,param,message", BAD_BODIES)
def test_a_bad_parameter_is_named_with_its_range(kind, body, param, message):
    with pytest.raises(InvalidParam) as caught:
        check_openai_body(body, kind)
    assert caught.value.param == param and message in str(caught.value)


def test_valid_parameters_pass():
    check_openai_body({"temperature": 0, "top_p": 1, "top_k": -1, "max_tokens": 1, "n": 1, "stream": False,
                       "stop": ["\n"], "logprobs": True, "top_logprobs": 0, "seed": 3, "frequency_penalty": -2,
                       "max_completion_tokens": 4.0}, "chat")
    check_openai_body({"temperature": 1.7, "top_p": 0.01, "top_k": 0, "logprobs": 1, "stop": "x"}, "completions")
    check_openai_body({"temperature": 2.5, "top_p": 0, "top_k": 5}, "chat")  # OpenAI's top_p range is [0, 1]
    assert check_prompt_ids([0, 5, 299], vocab_size=300) == [0, 5, 299]
    for ids, param in (([1, 300], "prompt[1]"), ([-1], "prompt[0]"), ([1, 2.5], "prompt[1]"), ([], "prompt")):
        with pytest.raises(InvalidParam, match=r"\[0, 300\)|non-empty") as caught:
            check_prompt_ids(ids, vocab_size=300)
        assert caught.value.param == param


class Engine:
    """A turn_fn answering [len(prompt), EOS]; raises on a prompt holding token 99 or a temperature of
    0.5 (an engine rejecting what one request carries); records every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, token_lists, max_tokens, params):
        self.calls.append(([list(t) for t in token_lists], params))
        if any(99 in t for t in token_lists):
            raise ValueError("poison token")
        if params.temperature == 0.5:
            raise ValueError("cannot sample at 0.5")
        return [([len(t), EOS], [-0.5, -0.5]) for t in token_lists]


def _agent(server, prompt, sampling=None):
    async def run():
        return (await server.generate(prompt, sampling)).token_ids
    return run


def test_a_request_the_engine_fails_on_fails_only_its_agent():
    engine = Engine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    results = server.run([_agent(server, [1, 2]), _agent(server, [99]), _agent(server, [3, 4, 5])], timeout_s=5)
    assert results[0] == ("ok", [2, EOS]) and results[2] == ("ok", [3, EOS])
    assert results[1][0] == "error" and results[1][1].startswith(
        "RequestFailed: the rollout engine failed on this request alone (ValueError: poison token)")
    # the round's one batched call, then each request alone
    assert [prompts for prompts, _ in engine.calls] == [[[1, 2], [99], [3, 4, 5]], [[1, 2]], [[99]], [[3, 4, 5]]]


def test_settings_the_engine_rejects_fail_only_the_agents_that_chose_them():
    engine = Engine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    results = server.run([_agent(server, [1], {"temperature": 0.5}), _agent(server, [2, 3])], timeout_s=5)
    assert results[0][0] == "error" and "cannot sample at 0.5" in results[0][1]
    assert results[1] == ("ok", [2, EOS])
    # alone in its round, a request with its own settings that fails is the agent's too
    alone = BatchingServer(Engine(), PARAMS, max_model_len=32)
    [(status, message)] = alone.run([_agent(alone, [1], {"temperature": 0.5})], timeout_s=5)
    assert status == "error" and "cannot sample at 0.5" in message


def test_sampling_settings_out_of_range_are_raised_into_their_agent_only():
    engine = Engine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    results = server.run([_agent(server, [1], {"top_p": -1}), _agent(server, [1], {"temperature": NAN}),
                          _agent(server, [], {}), _agent(server, [4, 5], {"top_k": 0, "temperature": 1e-40})],
                         timeout_s=5)
    assert results[0] == ("error", "InvalidParam: sampling_params.top_p=-1 is invalid: must be a number in [0, 1] "
                                   "(0 = greedy, 1 = no nucleus cut). Fix: send a top_p in [0, 1], or leave it out "
                                   "to use the rollout's.")
    assert results[1][0] == "error" and "sampling_params.temperature=nan is invalid" in results[1][1]
    assert results[2][0] == "error" and "prompt_ids must be a non-empty list" in results[2][1]
    assert results[3] == ("ok", [2, EOS])
    [(prompts, params)] = engine.calls  # only the valid request reached the engine
    assert prompts == [[4, 5]] and params == dataclasses.replace(PARAMS, top_k=-1, temperature=0.01)
    assert not any(math.isnan(p.temperature) or p.top_p <= 0 for _, p in engine.calls)


def test_top_p_zero_is_greedy_as_temperature_zero_is():
    """top_p -> 0 keeps only the most likely token: greedy. The engines (vLLM refuses top_p=0) get
    the greedy settings temperature 0 sends, whatever temperature came with it."""
    engine = Engine()
    server = BatchingServer(engine, PARAMS, max_model_len=32)
    results = server.run([_agent(server, [1], {"top_p": 0, "temperature": 0.7}), _agent(server, [2], {"top_p": 0.0}),
                          _agent(server, [3], {"temperature": 0})], timeout_s=5)
    assert results == [("ok", [1, EOS]), ("ok", [1, EOS]), ("ok", [1, EOS])]
    greedy = dataclasses.replace(PARAMS, temperature=0.0, do_sample=False, top_p=1.0, top_k=-1, seed=PARAMS.seed)
    [(prompts, params)] = engine.calls  # one setting, so one engine call
    assert prompts == [[1], [2], [3]] and params == greedy
