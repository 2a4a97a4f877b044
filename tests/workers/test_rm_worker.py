"""RewardModelWorker in RL on 2 Ray workers: scores of a rollout batch equal a plain transformers
``AutoModelForSequenceClassification`` forward on the reward model's rendering, with the policy's
tokenizer decoding responses (tokenizer mismatch), normalised with the saved statistics."""

from __future__ import annotations

import pytest
import ray
import torch

from hybrid_rl.data.layout import prompt_response_tensors
from hybrid_rl.protocol import DataProto
from hybrid_rl.protocol_utils import to_object_array
from hybrid_rl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
from hybrid_rl.utils.testing import CHAT_TEMPLATE, build_byte_tokenizer
from hybrid_rl.workers.config import CriticConfig, CriticModelConfig, FSDPConfig, MixedPrecisionConfig
from tests.tiny_models import build_tiny_reward_model_dir

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
MEAN, STD = 0.25, 2.0
PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 4 * 4?"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 9 - 1?"}],
           [{"role": "user", "content": "Say hi."}]]
RESPONSES = ["2 + 3 = 5\n#### 5", "16", "#### 8", ""]  # the last: an immediate end of turn


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("rm_worker")
    rm = build_tiny_reward_model_dir(root / "rm", tiny_model_dir, mean=MEAN, std=STD)
    # the policy's tokenizer: other ids for the same bytes and another chat template
    policy = build_byte_tokenizer(("<|x|>", "<|y|>"), CHAT_TEMPLATE.replace("<|im_start|>", "<|x|>"))
    policy.save_pretrained(root / "policy_tokenizer")
    return rm, str(root / "policy_tokenizer"), policy


def _group(rm_dir, **kwargs):
    fp32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))
    config = CriticConfig(model=CriticModelConfig(path=rm_dir, fsdp_config=fp32), ppo_mini_batch_size=2,
                          ppo_micro_batch_size_per_gpu=1)
    from hybrid_rl.workers.rm_worker import RewardModelWorker

    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_process=1)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(RewardModelWorker, config=config, **kwargs), call_timeout_s=300)
    group.init_model()
    return group, pool


def _rollout(policy) -> DataProto:
    prompts = [policy.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in PROMPTS]
    prompt_ids = [policy.encode(p, add_special_tokens=False) for p in prompts]
    response_ids = [policy.encode(r, add_special_tokens=False) + [policy.eos_token_id] for r in RESPONSES]
    tensors = prompt_response_tensors(prompt_ids, response_ids, [[1] * len(r) for r in response_ids],
                                      policy.pad_token_id)
    return DataProto.from_dict(tensors, non_tensors={"raw_prompt": to_object_array(PROMPTS)})


def _hf_scores(rm_dir) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    out = []
    for prompt, response in zip(PROMPTS, RESPONSES):
        text = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": response}], tokenize=False)
        with torch.no_grad():
            out.append(float(model(input_ids=torch.tensor([tokenizer.encode(text, add_special_tokens=False)])).logits[0, 0]))
    return torch.tensor(out)


def test_worker_scores_equal_transformers_and_are_normalised(folders):
    rm_dir, policy_dir, policy = folders
    assert not ray.is_initialized()
    init_ray(num_cpus=2)
    try:
        data = _rollout(policy)
        expected = _hf_scores(rm_dir)
        group, pool = _group(rm_dir, input_tokenizer=policy_dir)
        out = group.compute_rm_score(data)
        raw, token_level = out.batch["rm_raw_scores"], out.batch["rm_scores"]
        torch.testing.assert_close(raw, expected, rtol=1e-4, atol=1e-4)
        last = data.batch["attention_mask"][:, -data.batch["responses"].shape[1]:].sum(-1) - 1
        torch.testing.assert_close(token_level[torch.arange(4), last], (expected - MEAN) / STD, rtol=1e-4, atol=1e-4)
        assert float(token_level.abs().sum()) == pytest.approx(float(((expected - MEAN) / STD).abs().sum()), rel=1e-4)
        group.shutdown()
        pool.remove()
        # decoding the policy's ids with the reward model's own tokenizer reads other text: other scores
        group, pool = _group(rm_dir, normalize=False)
        wrong = group.compute_rm_score(data).batch["rm_raw_scores"]
        assert not torch.allclose(wrong, expected, atol=1e-3)
        group.shutdown()
        pool.remove()
    finally:
        ray.shutdown()
