"""Multi-turn generation on both engines (tiny fp32 model): the same trajectory layout from hf and vllm.

Every token id is made an EOS, so each model turn is exactly one sampled token; a registered test
interaction answers twice, then ends the trajectory. The layout is then fully known:
[x1] + reply + [x2] + reply + [x3], masks 1 / 0 / 1 / 0 / 1.
"""

import pytest
import torch

from hybrid_rl.agents import BaseInteraction, register_interaction
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason

_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]
R = 64
ALL_IDS_EOS = list(range(320))  # the tiny model's vocabulary: every turn ends after one token


@register_interaction("test_go_on_twice")
class GoOnTwice(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        turns = sum(m["role"] == "assistant" for m in messages)
        return turns >= 3, "go on", float(turns), {}


@pytest.fixture(scope="module")
def inter_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("agents") / "interactions.yaml"
    path.write_text("interaction:\n  - name: go\n    class_name: test_go_on_twice\n")
    return str(path)


def _engine(name, model_dir, inter_yaml):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=name, dtype="float32", response_length=R, prompt_length=40, calculate_log_probs=True,
                        max_num_seqs=16, cpu_kvcache_space_gib=0.25, seed=0,
                        multi_turn={"enable": True, "interaction_config_path": inter_yaml})
    tok = load_tokenizer(model_dir)
    return build_rollout(cfg, model_dir, tok, "cpu"), tok


def _prompts(rows, with_interaction):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    extra = [{"interaction_kwargs": {"name": "go"}} if with_interaction else {} for _ in rows]
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        non_tensors={"extra_info": extra, "raw_prompt": [[{"role": "user", "content": "q"}]] * len(rows)},
        meta_info={"eos_token_id": ALL_IDS_EOS, "pad_token_id": 0, "do_sample": False, "global_steps": 1})


@pytest.fixture(scope="module", params=ENGINES)
def layout(request, tiny_model_dir, inter_yaml):
    engine, tok = _engine(request.param, tiny_model_dir, inter_yaml)
    try:
        out = engine.generate_sequences(_prompts([[5, 6, 7], [9, 10, 11, 12]], with_interaction=True))
        single = engine.generate_sequences(_prompts([[5, 6, 7]], with_interaction=False))
    finally:
        engine.shutdown()
    return request.param, out, single, tok


def test_trajectory_layout_masks_and_columns(layout):
    name, out, single, tok = layout
    reply = ObservationEncoder(tok, "<|im_end|>").encode([{"role": "user", "content": "go on"}])
    expected_mask = [1] + [0] * len(reply) + [1] + [0] * len(reply) + [1]
    b = out.batch
    for i in range(2):
        n = len(expected_mask)
        assert b["response_mask"][i].tolist() == expected_mask + [0] * (R - n), name
        assert b["attention_mask"][i, -R:].tolist() == [1] * n + [0] * (R - n)
        resp = b["responses"][i].tolist()
        assert resp[1:1 + len(reply)] == reply and resp[2 + len(reply):2 + 2 * len(reply)] == reply
        lp = b["rollout_log_probs"][i]
        assert bool((lp[:n][torch.tensor(expected_mask) == 0] == 0).all()) and float(lp[0]) < 0
    assert list(out.non_tensor_batch["num_turns"]) == [6, 6]  # 3 assistant + 2 replies + the prompt
    assert list(out.non_tensor_batch["turn_scores"][0]) == [1.0, 2.0, 3.0]
    assert out.non_tensor_batch["agent_metrics"][0]["ended_by/interaction"] == 1.0
    assert out.meta_info["metrics"]["agent/num_turns/mean"] == 6.0
    # a row without interaction_kwargs is one turn, scored as single-turn
    assert single.batch["response_mask"][0].tolist() == [1] + [0] * (R - 1)
    assert single.non_tensor_batch["agent_metrics"][0]["ended_by/stop"] == 1.0


def test_model_turns_are_the_greedy_continuations(layout, tiny_model_dir):
    """Token faithfulness: each sampled id is the greedy next token of exactly the sequence trained on."""
    from hybrid_rl.workers.model_loader import load_causal_lm

    _, out, _, _ = layout
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    ids, attn, mask = out.batch["input_ids"], out.batch["attention_mask"], out.batch["response_mask"]
    width = out.batch["prompts"].shape[1]
    for i in range(ids.shape[0]):
        seq = ids[i][attn[i].bool()]
        start = int((~attn[i, :width].bool()).sum())  # left padding
        logits = model(seq[None]).logits[0]  # [T, V]
        for pos in mask[i].nonzero().flatten().tolist():
            t = width - start + pos  # index of the response token in the unpadded sequence
            assert int(logits[t - 1].argmax()) == int(seq[t])
