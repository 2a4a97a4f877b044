"""A custom agent loop on both engines (tiny fp32 model): the ids and log-probs it records are exactly
what the engine sampled. A loop that makes the built-in single-turn call through the batching server
must give the same tokens and log-probs as the built-in ``single_turn_agent`` rows (same seed, same
batch composition: the server's round 0 is the built-in call)."""

import pytest
import torch

from hybrid_rl.agents import AgentLoopBase, AgentLoopOutput, register_agent_loop
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason

_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
R = 12
ROWS = [[5, 6, 7], [9, 10, 11, 12], [40, 41]]


@register_agent_loop("test_echo_single_call")
class EchoSingleCall(AgentLoopBase):
    """The single-turn rollout written as a custom loop: the row's own prompt ids, one model call."""

    async def run(self, sampling_params, **kwargs):
        prompt = list(kwargs["test_prompt_ids"])
        out = await self.server_manager.generate("req", prompt_ids=prompt, sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=out.token_ids, response_mask=[1] * len(out.token_ids),
                               response_logprobs=out.log_probs, num_turns=2)


def _prompts(agent_name):
    width = max(len(r) for r in ROWS)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in ROWS])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ROWS])
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        non_tensors={"agent_name": [agent_name] * len(ROWS), "test_prompt_ids": [list(r) for r in ROWS],
                     "raw_prompt": [[{"role": "user", "content": "q"}]] * len(ROWS)},
        meta_info={"eos_token_id": [1], "pad_token_id": 0, "do_sample": True, "seed": 123, "global_steps": 1})


@pytest.mark.parametrize("engine_name", ENGINES)
def test_custom_loop_records_exactly_what_the_engine_sampled(engine_name, tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=engine_name, dtype="float32", response_length=R, prompt_length=16, calculate_log_probs=True,
                        max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0, temperature=1.0,
                        agent={"default_agent_loop": "single_turn_agent"})
    engine = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    try:
        custom = engine.generate_sequences(_prompts("test_echo_single_call"))
        builtin = engine.generate_sequences(_prompts("single_turn_agent"))
    finally:
        engine.shutdown()
    for key in ("responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(custom.batch[key], builtin.batch[key]), (engine_name, key)
    assert torch.equal(custom.batch["rollout_log_probs"], builtin.batch["rollout_log_probs"]), engine_name
    assert custom.batch["response_mask"].sum() > len(ROWS)  # sampled several tokens, not just an EOS
    assert (custom.batch["rollout_log_probs"] * custom.batch["response_mask"] < 0).any()


async def one_chat_call(client, row):
    """A black-box agent making the single-turn call through the OpenAI endpoint."""
    await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]))


@pytest.mark.parametrize("engine_name", ENGINES)
def test_openai_endpoint_records_exactly_what_the_engine_sampled(engine_name, tiny_model_dir, tmp_path):
    from hybrid_rl.workers.model_loader import load_tokenizer

    path = tmp_path / "agents.yaml"
    path.write_text(f"- name: oa_one_call\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                    f"  agent: {__name__}.one_chat_call\n")
    tok = load_tokenizer(tiny_model_dir)
    questions = ["q one", "question two", "3"]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"] for q in questions]
    width = max(map(len, prompts))
    cfg = RolloutConfig(name=engine_name, dtype="float32", response_length=R, prompt_length=width, calculate_log_probs=True,
                        max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0, temperature=1.0,
                        agent={"agent_loop_config_path": str(path)})
    engine = build_rollout(cfg, tiny_model_dir, tok, "cpu")

    def batch(agent_name):
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return DataProto.from_dict(
            {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
            non_tensors={"agent_name": [agent_name] * 3, "raw_prompt": [[{"role": "user", "content": q}] for q in questions]},
            meta_info={"eos_token_id": [1], "pad_token_id": 0, "do_sample": True, "seed": 99, "global_steps": 1})

    try:
        custom, builtin = engine.generate_sequences(batch("oa_one_call")), engine.generate_sequences(batch("single_turn_agent"))
    finally:
        engine.shutdown()
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(custom.batch[key], builtin.batch[key]), (engine_name, key)
    assert custom.meta_info["metrics"]["agent/ended_by/error"] == 0.0
