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


def _batch(names, prefix=""):
    import torch

    from hybrid_rl.protocol import DataProto

    n = len(names)
    ids, mask = torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                               non_tensors={"agent_name": [prefix + a for a in names],
                                            "raw_prompt": [[{"role": "user", "content": f"What is 6*7? ({a})"}]
                                                           for a in names], "extra_info": [{"index": i} for i in range(n)]})


class _EnvPolicy:
    """A turn_fn: a conversation without an observation answers 'a' + EOS; later turns run past the budget."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, token_lists, max_tokens, params):
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            text = "a" if "obs" not in self.tok.decode(tokens) else "x" * 400
            ids = (self.tok(text, add_special_tokens=False)["input_ids"] + [EOS])[:limit]
            out.append((ids, [-0.1] * len(ids)))
        return out


def _generator(tmp_path, yaml, **agent):
    from hybrid_rl.workers.rollout.config import RolloutConfig
    from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator

    path = tmp_path / "agents.yaml"
    path.write_text(yaml)
    cfg = RolloutConfig(name="hf", response_length=120, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), **agent})
    return MultiTurnGenerator(cfg, build_byte_tokenizer(), EOS)


def test_an_env_is_named_by_its_module_and_env_steps_count_step_calls(tmp_path, tok):
    import sys

    from hybrid_rl.agents.env import get_env_cls
    from hybrid_rl.workers.rollout.base import GenerationParams

    assert "tests.agents.newcomer_envs" not in sys.modules  # nothing imported the module that registers it
    with pytest.raises(ValueError) as bare:
        get_env_cls("newcomer_echo", "EnvAgentLoop env")
    assert str(bare.value).startswith("EnvAgentLoop env: 'newcomer_echo' is not a registered environment; an "
                                      "@register_env name is known only once its module is imported, so name the "
                                      "module too, e.g. env: my_pkg.envs:newcomer_echo. Fix: use a registered "
                                      "environment (")
    with pytest.raises(ValueError, match="cannot import environment 'no_such_pkg:echo' .*ModuleNotFoundError"):
        get_env_cls("no_such_pkg:echo", "EnvAgentLoop env")
    gen = _generator(tmp_path, "- name: echo\n  _target_: hybrid_rl.agents.env_loop.EnvAgentLoop\n"
                               "  env: tests.agents.newcomer_envs:newcomer_echo\n  max_steps: 5\n")
    params = GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=3, eos_token_ids=(EOS,),
                              pad_token_id=0, response_length=120)
    out = gen.generate(_batch(["echo"]), [[1]], params, _EnvPolicy(tok))
    # turn 1 'a' -> step() -> an observation; turn 2 runs past the budget: no action, no step() call
    metrics = out.meta_info["metrics"]
    assert metrics["agent/loop/env_steps"] == 1.0 and metrics["agent/loop/env_turns"] == 2.0
    assert list(out.non_tensor_batch["reward_score"]) == [1.0]


async def raises_after_a_call(client, row):
    await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]))
    await client.chat.completions.create(model="p", messages=list(row["raw_prompt"]))
    raise RuntimeError("agent bug")


def test_failure_kinds_calls_of_failed_agents_logs_and_progress(tmp_path, tok, caplog):
    from tests.agents.test_openai_agent import PARAMS, Scripted

    names = ["solve", "raises_after_a_call", "raises", "hangs", "garbage"]
    where = {"solve": "tests.agents.test_openai_agent", "raises": "tests.agents.test_openai_agent",
             "hangs": "tests.agents.test_openai_agent", "garbage": "tests.agents.test_openai_agent",
             "raises_after_a_call": __name__}
    gen = _generator(tmp_path, "".join(f"- name: nf_{n}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                                       f"  agent: {where[n]}.{n}\n" for n in names), timeout_s=12,
                     progress_interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="hybrid_rl.agents"):
        out = gen.generate(_batch(names, "nf_"), [[1]] * 5, PARAMS, Scripted(tok))
    assert list(out.non_tensor_batch["agent_failure"]) == ["", "exception", "exception", "timeout", "bad_return"]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/failure/exception"] == 0.4 and metrics["agent/failure/timeout"] == 0.2
    assert metrics["agent/failure/bad_return"] == 0.2 and metrics["agent/ended_by/error"] == 0.8
    # calls per row: solve 2, raises_after_a_call 2, raises 1, hangs 0, garbage 1 (failed agents' calls count)
    assert metrics["agent/loop/calls"] == pytest.approx((2 + 2 + 1 + 0 + 1) / 5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # one line per failure kind, with its count
    assert warnings[0].startswith("1 of 5 agent-loop rows failed by bad_return (")
    assert warnings[1].startswith("2 of 5 agent-loop rows failed by exception (scored 0, counted in "
                                  "agent/ended_by/error and agent/failure/exception); first: agent loop "
                                  "'nf_raises_after_a_call': error: RuntimeError: agent bug")
    assert warnings[2].startswith("1 of 5 agent-loop rows failed by timeout (")
    progress = [r.getMessage() for r in caplog.records if r.name == "hybrid_rl.agents.progress"]
    assert progress and progress[-1].startswith("agent rows: 1/5 done, 0 running, 4 failed (")
    assert progress[-1].endswith(" s): finished")
    assert any(", 1 running, " in line for line in progress[:-1])  # the hung agent, shown while it runs


def test_progress_lines_reach_a_workers_console():
    from hybrid_rl.utils.log_setup import QuietConsoleFilter

    worker = QuietConsoleFilter(own_level=logging.WARNING)  # a rollout worker's console
    record = logging.LogRecord("hybrid_rl.agents.progress", logging.INFO, __file__, 1, "agent rows: 1/2 done", (), None)
    chatter = logging.LogRecord("hybrid_rl.agents.agent_runner", logging.INFO, __file__, 1, "x", (), None)
    assert worker.filter(record) and not worker.filter(chatter)


def test_progress_counts_and_throttles():
    from hybrid_rl.agents.progress import AgentProgress

    async def ok():
        return 1

    async def bad():
        raise RuntimeError("x")

    progress = AgentProgress(3, None)

    async def run():
        for coro in (ok(), bad()):
            try:
                await progress.track(coro)
            except RuntimeError:
                pass
        await progress.track(ok(), valid=lambda value: value == 2)

    asyncio.run(run())
    assert (progress.done, progress.failed) == (1, 2)
    assert progress.line().startswith("agent rows: 1/3 done, 0 running, 2 failed (")


def test_a_streamed_rows_failure_kind_reaches_its_column_and_the_metrics():
    from hybrid_rl.agents.agent_runner import row_trajectory
    from hybrid_rl.trainer.ppo.stream_groups import agent_batch_metrics, assemble_group
    from hybrid_rl.workers.rollout.multi_turn import _row_metrics
    from tests.trainer.test_stream_agent_groups import PARAMS, _group, _sample

    failed, problem = row_trajectory("timeout", "no answer within 3 s", [7, 8], 6, 4)
    assert (failed.failure, failed.end_reason, failed.reward_score, problem) == (
        "timeout", "error", 0.0, "timeout: no answer within 3 s")
    group = _group()
    group.samples = {0: _sample("1:0:0", [7, 8], [4, 2], [1, 1], [0, 0], 1.0),
                     1: _sample("1:0:1", [7, 8], [], [], [], 0.0)}
    group.samples[1]["meta"]["trajectory"]["failure"] = failed.failure  # as agent_stream._to_sample writes it
    out = assemble_group(group, PARAMS, with_log_probs=True)
    assert list(out.non_tensor_batch["agent_failure"]) == ["", "timeout"]
    metrics = agent_batch_metrics([_row_metrics(t) for t in (failed, failed.__class__(prompt_ids=[1]))])
    assert metrics["agent/failure/timeout"] == 0.5 and metrics["agent/failure/exception"] == 0.0
