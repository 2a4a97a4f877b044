"""Issue 57 item 2, the rollout: under ``agent.rows: every_call`` a black-box agent that runs a sub-agent
(two independent call chains over the OpenAI endpoint) gives two rows, each with exact ids, masks and
log-probs, its input row's columns, ``rollout_row`` and ``rollout_rows``; ``chain`` keeps one row."""

import pytest
import torch

from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.agents.config import AgentLoopConfig
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from hybrid_rl.utils.testing import build_byte_tokenizer
from test_openai_agent import CALL, EOS, PARAMS, TOOLS, Scripted


async def _chat_with_tool(client, messages):
    """A conversation: the model asks for the calculator, gets 42 back, answers."""
    first = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    message = first.choices[0].message
    messages = messages + [message.model_dump(exclude_none=True),
                           {"role": "tool", "content": "42", "tool_call_id": message.tool_calls[0].id}]
    second = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    return second.choices[0].message.content


async def with_sub_agent(client, row):
    """The main conversation, then a sub-agent's own conversation (another prompt): two chains."""
    main = await _chat_with_tool(client, list(row["raw_prompt"]))
    sub = await _chat_with_tool(client, [{"role": "user", "content": "sub-agent: check 6*7"}])
    return {"reward": float(main.strip() == sub.strip() == "#### 42")}


async def single(client, row):
    """One conversation: one row under either setting."""
    return float((await _chat_with_tool(client, list(row["raw_prompt"]))).strip() == "#### 42") / 2


def _generator(tmp_path, rows):
    path = tmp_path / "agents.yaml"
    path.write_text("".join(f"- name: ec_{name}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                            f"  agent: {__name__}.{name}\n" for name in ("with_sub_agent", "single")))
    cfg = RolloutConfig(name="hf", response_length=200, prompt_length=300, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path), "timeout_s": 5, "rows": rows})
    tok = build_byte_tokenizer()
    return MultiTurnGenerator(cfg, tok, EOS), tok


def _batch(names, rollout_row=None):
    n = len(names)
    ids, mask = torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long)
    columns = {"agent_name": [f"ec_{a}" for a in names], "uid": [f"u{i}" for i in range(n)],
               "raw_prompt": [[{"role": "user", "content": f"What is 6*7? ({a})"}] for a in names]}
    if rollout_row is not None:
        columns["rollout_row"] = rollout_row
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                               non_tensors=columns)


def _ids(tok, messages):
    return tok(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"]


def _row(out, i):
    """(prompt ids, response ids, response mask, log-probs) of row i, without padding."""
    b = out.batch
    n = int(b["attention_mask"][i, b["prompts"].shape[1]:].sum())
    prompt = b["prompts"][i][b["attention_mask"][i, :b["prompts"].shape[1]].bool()].tolist()
    return (prompt, b["responses"][i, :n].tolist(), b["response_mask"][i].tolist(),
            b["rollout_log_probs"][i, :n].tolist())


def test_a_sub_agent_gives_a_row_of_its_own_with_exact_masks_and_the_rollouts_score(tmp_path):
    gen, tok = _generator(tmp_path, "every_call")
    engine = Scripted(tok)
    out = gen.generate(_batch(["with_sub_agent", "single"], rollout_row=[5, 6]), [[1]] * 2, PARAMS, engine)
    assert len(out) == 3
    assert list(out.non_tensor_batch["rollout_row"]) == [5, 5, 6]  # the driver's numbering, copied
    assert list(out.non_tensor_batch["rollout_rows"]) == [2, 2, 1]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u0", "u1"]  # the input row's columns, repeated
    assert list(out.non_tensor_batch["reward_score"]) == [1.0, 1.0, 0.5]
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok("#### 42", add_special_tokens=False)["input_ids"] + [EOS]
    tool_turn = ObservationEncoder(tok, tok.eos_token).encode([{"role": "tool", "content": "42"}])
    response = call + tool_turn + answer
    mask = [1] * len(call) + [0] * len(tool_turn) + [1] * len(answer) + [0] * (200 - len(response))
    lps = [-0.25 - 0.01 * k for k in range(len(call))] + [0.0] * len(tool_turn) + \
          [-0.25 - 0.01 * k for k in range(len(answer))]
    prompts = [_ids(tok, [{"role": "user", "content": "What is 6*7? (with_sub_agent)"}]),
               _ids(tok, [{"role": "user", "content": "sub-agent: check 6*7"}]),
               _ids(tok, [{"role": "user", "content": "What is 6*7? (single)"}])]
    for i in range(3):
        got_prompt, got_response, got_mask, got_lps = _row(out, i)
        assert (got_prompt, got_response, got_mask) == (prompts[i], response, mask), i
        assert got_lps == pytest.approx(lps), i
    sampled = sum(len(call) if "<|im_start|>tool" not in tok.decode(c) else len(answer) for c in engine.calls)
    assert int(out.batch["response_mask"].sum()) == sampled  # every sampled token is trained, once
    assert out.meta_info["metrics"]["agent/loop/calls_off_row"] == 0.0


def test_chain_keeps_one_row_per_rollout_and_validation_one_row_under_every_call(tmp_path):
    gen, tok = _generator(tmp_path, "chain")
    out = gen.generate(_batch(["with_sub_agent", "single"]), [[1]] * 2, PARAMS, Scripted(tok))
    assert len(out) == 2 and "rollout_row" not in out.non_tensor_batch
    assert out.meta_info["metrics"]["agent/loop/calls_off_row"] == 1.0  # mean of 2 (sub-agent) and 0
    every, _ = _generator(tmp_path, "every_call")
    batch = _batch(["with_sub_agent", "single"])
    batch.meta_info["validate"] = True
    val = every.generate(batch, [[1]] * 2, PARAMS, Scripted(tok))
    assert len(val) == 2 and list(val.non_tensor_batch["rollout_row"]) == [0, 1]
    main = _ids(tok, [{"role": "user", "content": "What is 6*7? (with_sub_agent)"}])
    assert _row(val, 0)[0] == main  # a rollout's first row: the conversation it started first


def test_rows_must_be_chain_or_every_call():
    with pytest.raises(ValueError, match=r"^rollout.agent.rows='all' is invalid: must be one of \('chain', "
                                         r"'every_call'\). Fix: use chain \(one row per rollout\) or every_call.$"):
        AgentLoopConfig(rows="all")
