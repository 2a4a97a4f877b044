"""Supervised fine-tuning on the actor's update path: ``sft_batch`` + ``loss_mode=sft``."""

import copy

import pytest
import torch

from hybrid_rl.data.sft import sft_batch, tokenize_example
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.config import PolicyLossConfig
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, hf_response_log_probs

CONVERSATIONS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "#### 4"}],
    [{"role": "user", "content": "3*3?"}, {"role": "assistant", "content": "#### 9"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "1+1?"},
     {"role": "assistant", "content": "#### 2"}],
    [{"role": "user", "content": "7-5?"}, {"role": "assistant", "content": "#### 2"}],
]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


def _batch():
    tok = build_byte_tokenizer()
    rows = [tokenize_example(tok, m, max_length=200) for m in CONVERSATIONS]
    data = DataProto.from_dict(sft_batch(rows, tok.pad_token_id), meta_info={"temperature": 1.0})
    return data, rows


def _nll(model, data):
    mask = data.batch["response_mask"].float()
    logp = hf_response_log_probs(model, data, temperature=1.0)
    return float(-(logp * mask).sum() / mask.sum())


def _update(model, data, steps=1, **cfg):
    model = copy.deepcopy(model)
    config = actor_config(ppo_mini_batch_size=4, policy_loss=PolicyLossConfig(loss_mode="sft"), **cfg)
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.05),
                                 use_remove_padding=True)
    for _ in range(steps):
        metrics = actor.update_policy(data)
    return model, metrics


def test_sft_batch_keeps_the_conversation_and_masks_only_assistant_turns():
    data, rows = _batch()
    b = data.batch
    for i, (ids, mask) in enumerate(rows):
        valid = b["attention_mask"][i].bool()
        assert b["input_ids"][i][valid].tolist() == ids  # the whole conversation, unpadded
        width = b["prompts"].shape[1]
        response_valid = b["attention_mask"][i, width:].bool()
        assert b["response_mask"][i][response_valid].tolist() == mask[mask.index(1):]
    assert b["response_mask"][2].sum() < b["attention_mask"][2, b["prompts"].shape[1]:].sum()  # a user turn in it


def test_sft_update_lowers_the_nll_and_its_loss_is_the_nll(model):
    data, _ = _batch()
    before = _nll(model, data)
    trained, metrics = _update(model, data, steps=5)
    assert _nll(trained, data) < before - 0.1
    _, first = _update(model, data, steps=1)
    assert first["actor/pg_loss"][0] == pytest.approx(before, rel=1e-4)  # the loss is the token-mean NLL


def test_sft_update_is_micro_batch_invariant(model):
    data, _ = _batch()
    whole, _ = _update(model, data, ppo_micro_batch_size_per_gpu=4)
    split, _ = _update(model, data, ppo_micro_batch_size_per_gpu=1)
    for (name, a), b in zip(whole.state_dict().items(), split.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
