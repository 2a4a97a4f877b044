"""Issue 57 item 6: what a newcomer hit with the OpenAI-compatible endpoint. Each test fails without its
fix: the reward error's hint for agent rows, a ``length``-cut reply continued from its recorded ids,
progress lines while agents run, an environment named by ``module:Name``, and the per-row failure kinds,
call and step counts."""

import asyncio
import logging

import pytest

from hybrid_rl.agents.openai_agent import output_from_calls
from hybrid_rl.agents.openai_server import OpenAIEndpoint
from hybrid_rl.agents.server import TokenOutput
from hybrid_rl.reward import NaiveRewardManager
from hybrid_rl.utils.testing import build_byte_tokenizer
from tests.reward.test_manager import make_batch

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def test_the_unknown_source_error_says_how_to_mark_agent_rows(tok):
    data = make_batch(tok, ["#### 1"], [1], sources=["my_agent_task"])
    with pytest.raises(ValueError) as plain:
        NaiveRewardManager(tok, 0)(data)
    assert "style: agent" not in str(plain.value)  # a row without an agent gets the plain advice
    data.non_tensor_batch["agent_name"] = data.non_tensor_batch["data_source"].copy()
    with pytest.raises(ValueError, match="no reward function for data_source 'my_agent_task'") as hinted:
        NaiveRewardManager(tok, 0)(data)
    assert "mark them reward_model: {style: agent} in the dataset" in str(hinted.value)
    assert "register_reward('my_agent_task')" in str(hinted.value)  # the other way still named


class _CutThenEnd:
    """The first call is cut by max_tokens after ids [67, 0, 68] ('a', <|endoftext|>, 'b': decoded 'ab',
    which re-encodes to [67, 68]); later calls end with EOS."""

    def __init__(self):
        self.prompts = []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.prompts.append(list(prompt_ids))
        if len(self.prompts) == 1:
            return TokenOutput(token_ids=[67, 0, 68], log_probs=[-0.1, -0.2, -0.3], stop_reason="length")
        return TokenOutput(token_ids=[69, EOS], log_probs=[-0.4, -0.5], stop_reason="completed")


def test_a_reply_cut_by_max_tokens_is_continued_from_its_recorded_ids(tok):
    manager, endpoint = _CutThenEnd(), OpenAIEndpoint(tok)
    try:
        key = endpoint.open(manager, {})
        messages = [{"role": "user", "content": "hi"}]
        first = asyncio.run(endpoint.chat(key, {"messages": messages, "max_tokens": 3}))["choices"][0]
        assert first["finish_reason"] == "length" and first["message"]["content"] == "ab"
        messages += [first["message"], {"role": "user", "content": "go on"}]
        asyncio.run(endpoint.chat(key, {"messages": messages}))
        calls = endpoint.close(key)
    finally:
        endpoint.shutdown()
    delta = endpoint.encoder.encode([{"role": "user", "content": "go on"}])
    assert calls[1].parent == 0  # one chain: the agent's score belongs to a row that holds both calls
    # the recorded ids, then the template's end-of-turn id (the cut reply has none), then the new turn
    assert manager.prompts[1] == calls[0].prompt_ids + [67, 0, 68] + [EOS] + delta
    out = output_from_calls(calls, 1.0)
    assert out.prompt_ids == calls[0].prompt_ids
    assert out.response_ids == [67, 0, 68, EOS] + delta + [69, EOS]
    assert out.response_mask == [1, 1, 1] + [0] * (1 + len(delta)) + [1, 1]
    assert out.response_logprobs == [-0.1, -0.2, -0.3] + [0.0] * (1 + len(delta)) + [-0.4, -0.5]
    assert out.metrics["calls_off_row"] == 0.0


def test_the_preflight_check_gives_the_hint_for_a_dataset_of_agent_rows():
    from types import SimpleNamespace

    from hybrid_rl.trainer.ppo.preflight import check_reward_coverage
    from hybrid_rl.workers.rollout.config import RolloutConfig

    class Rows:
        def __init__(self, agents):
            self.agents = agents

        def data_sources(self, scored_only=False):
            return ["my_agent_task"]

        def agent_names(self):
            return self.agents

    def cfg(agent):
        return SimpleNamespace(custom_reward_function=SimpleNamespace(path=None),
                               data=SimpleNamespace(reward_fn_key="data_source", train_files="t.jsonl", val_files=None),
                               actor_rollout_ref=SimpleNamespace(rollout=RolloutConfig(name="hf", agent=agent)))

    for config, rows, hinted in ((cfg({}), Rows([]), False), (cfg({}), Rows(["solve"]), True),
                                 (cfg({"default_agent_loop": "solve"}), Rows([]), True)):
        with pytest.raises(ValueError, match="data.train_files='t.jsonl': no reward function") as error:
            check_reward_coverage(config, rows)
        assert ("reward_model: {style: agent}" in str(error.value)) == hinted
