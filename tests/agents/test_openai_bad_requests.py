"""A black-box agent's bad request is answered 400 to that agent alone (the official ``openai`` client
raises ``BadRequestError``) while the other rows of the same rollout, on the real engine (tiny fp32
model, hf), finish and train."""

import json

import httpx
import openai
import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

R = 8
SEEN: dict[str, dict] = {}
"""What the bad agents were answered (they run in this process, on the agents' event loop)."""


async def good(client, row):
    reply = await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]), top_p=0.9)
    return {"reward": 1.0, "tokens": float(reply.usage.completion_tokens)}


async def bad_top_p(client, row):
    """Sends top_p=-1 through the official client and does not handle the error: its row fails."""
    try:
        await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]), top_p=-1)
    except openai.BadRequestError as exc:
        SEEN["top_p"] = {"status": exc.status_code, "body": exc.body}
        raise


async def bad_temperature(client, row):
    """Sends temperature NaN (the openai client refuses to encode NaN, a raw HTTP client does not), then
    retries with a valid request: its row is trained on."""
    body = ('{"model": "policy", "temperature": NaN, "messages": %s}' % json.dumps(list(row["raw_prompt"])))
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.post(f"{client.base_url}chat/completions", content=body,
                                 headers={"Content-Type": "application/json"})
    SEEN["temperature"] = {"status": answer.status_code, "body": answer.json()}
    await client.chat.completions.create(model="policy", messages=list(row["raw_prompt"]))
    return 0.5


AGENTS = ["good", "bad_top_p", "good", "bad_temperature"]


def _batch(tok, questions):
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"] for q in questions]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return width, DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        non_tensors={"agent_name": [f"oa_{a}" for a in AGENTS],
                     "raw_prompt": [[{"role": "user", "content": q}] for q in questions]},
        meta_info={"eos_token_id": [1], "pad_token_id": 0, "do_sample": True, "seed": 3, "global_steps": 1})


def _rollout(tiny_model_dir, tmp_path) -> DataProto:
    from hybrid_rl.workers.model_loader import load_tokenizer

    path = tmp_path / "agents.yaml"
    path.write_text("".join(f"- name: oa_{a}\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                            f"  agent: {__name__}.{a}\n" for a in sorted(set(AGENTS))))
    tok = load_tokenizer(tiny_model_dir)
    width, batch = _batch(tok, [f"question {i}" for i in range(len(AGENTS))])
    cfg = RolloutConfig(name="hf", dtype="float32", response_length=R, prompt_length=width, calculate_log_probs=True,
                        seed=0, temperature=1.0, agent={"agent_loop_config_path": str(path), "timeout_s": 60})
    engine = build_rollout(cfg, tiny_model_dir, tok, "cpu")
    try:
        return engine.generate_sequences(batch)
    finally:
        engine.shutdown()


def _train_once(tiny_model_dir, out: DataProto) -> tuple[dict, float]:
    """One PPO update of the tiny policy on the rollout's rows; (metrics, largest weight change)."""
    from hybrid_rl.workers.actor import DataParallelPPOActor
    from hybrid_rl.workers.model_loader import load_causal_lm
    from tests.workers.helpers import actor_config

    model = load_causal_lm(tiny_model_dir, dtype="float32")
    before = [p.detach().clone() for p in model.parameters()]
    mask = out.batch["response_mask"].float()
    scores = torch.tensor([float(s) for s in out.non_tensor_batch["reward_score"]])
    data = DataProto.from_dict({**dict(out.batch.items()), "old_log_probs": out.batch["rollout_log_probs"],
                                "advantages": (scores[:, None] - scores.mean()) * mask},
                               meta_info={"temperature": 1.0})
    actor = DataParallelPPOActor(actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4), model,
                                 torch.optim.SGD(model.parameters(), lr=1e-1))
    metrics = actor.update_policy(data)
    return metrics, max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))


def test_a_bad_request_fails_its_agent_only_and_the_other_rows_train(tiny_model_dir, tmp_path):
    out = _rollout(tiny_model_dir, tmp_path)
    top_p, temperature = SEEN["top_p"], SEEN["temperature"]
    assert top_p["status"] == 400 and top_p["body"] == {
        "message": "top_p=-1 is invalid: must be a number in [0, 1] (0 = greedy, 1 = no nucleus cut). Fix: send a "
                   "top_p in [0, 1], or leave it out to use the rollout's.",
        "type": "invalid_request_error", "param": "top_p", "code": "invalid_value"}
    assert temperature["status"] == 400 and temperature["body"]["error"]["param"] == "temperature"
    assert temperature["body"]["error"]["message"].startswith("temperature=nan is invalid: must be a finite number")
    assert list(out.non_tensor_batch["reward_score"]) == [1.0, 0.0, 1.0, 0.5]
    sampled = out.batch["response_mask"].sum(1).tolist()
    assert sampled[1] == 0 and all(n > 0 for i, n in enumerate(sampled) if i != 1)
    assert out.meta_info["metrics"]["agent/ended_by/error"] == pytest.approx(0.25)  # the top_p row only
    metrics, moved = _train_once(tiny_model_dir, out)
    assert all(torch.isfinite(torch.tensor(v)).all() for v in metrics["actor/pg_loss"]) and moved > 0
