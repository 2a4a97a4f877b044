"""Supervised fine-tuning on the actor's update path: ``sft_batch`` + ``actor.objective={name: nll}``."""

import copy

import pytest
import torch

from hybrid_rl.data.sft import sft_batch, tokenize_example
from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.testing import build_byte_tokenizer
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.objectives.supervised import NLLObjective
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


PPO_METRICS = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy"}


def _update(model, data, steps=1, **cfg):
    model = copy.deepcopy(model)
    config = actor_config(**{"ppo_mini_batch_size": 4, "objective": {"name": "nll"}, **cfg})
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
    assert first["sft/loss"][0] == pytest.approx(before, rel=1e-4)  # the loss is the token-mean NLL


def test_sft_update_is_micro_batch_invariant(model):
    data, _ = _batch()
    whole, _ = _update(model, data, ppo_micro_batch_size_per_gpu=4)
    split, _ = _update(model, data, ppo_micro_batch_size_per_gpu=1)
    for (name, a), b in zip(whole.state_dict().items(), split.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_sft_batch_holds_no_ppo_inputs():
    data, _ = _batch()
    assert set(data.batch.keys()) == {"prompts", "responses", "response_mask", "input_ids", "attention_mask",
                                      "position_ids"}


def test_sft_update_reports_the_nll_and_no_ppo_metric(model):
    data, _ = _batch()
    _, metrics = _update(model, data)
    assert not PPO_METRICS & set(metrics), sorted(metrics)
    assert set(metrics) == {"sft/loss", "actor/padding_frac", "actor/grad_norm", "actor/num_skipped_steps"}


def test_a_ppo_actor_config_with_objective_nll_trains_the_nll(model):
    """``actor.objective={name: nll}`` in an otherwise PPO actor section: the actor trains the NLL (its
    loss_agg_mode taken from the actor's), with no old_log_probs or advantages in the batch."""
    data, _ = _batch()
    config = actor_config(ppo_mini_batch_size=4, objective={"name": "nll"}, loss_agg_mode="seq-mean-token-mean")
    trained = copy.deepcopy(model)
    actor = DataParallelPPOActor(config, trained, torch.optim.SGD(trained.parameters(), lr=0.0))
    assert isinstance(actor.objective, NLLObjective) and actor.objective.config.loss_agg_mode == "seq-mean-token-mean"
    mask = data.batch["response_mask"].float()
    logp = hf_response_log_probs(model, data, temperature=1.0)
    by_hand = float((-(logp * mask).sum(-1) / mask.sum(-1)).mean())  # each conversation weighs the same
    metrics = actor.update_policy(data)
    assert metrics["sft/loss"][0] == pytest.approx(by_hand, rel=1e-4)
    assert by_hand != pytest.approx(_nll(model, data), rel=1e-3)  # the two aggregations differ on this batch


def test_nll_trains_exactly_as_the_sft_policy_loss_did(model):
    """The old SFT path (policy loss ``sft`` on zero old_log_probs / advantages; still registered for
    PPO) and the ``nll`` objective give the same loss and the same weights, bit for bit."""
    data, _ = _batch()
    zeros = torch.zeros(data.batch["responses"].shape)
    old = DataProto.from_dict({**dict(data.batch.items()), "old_log_probs": zeros, "advantages": zeros.clone()},
                              meta_info=data.meta_info)
    by_policy_loss, old_metrics = _update(model, old, objective={}, policy_loss=PolicyLossConfig(loss_mode="sft"))
    by_nll, metrics = _update(model, data)
    assert metrics["sft/loss"] == old_metrics["actor/pg_loss"]
    for (name, a), b in zip(by_policy_loss.state_dict().items(), by_nll.state_dict().values()):
        assert torch.equal(a, b), name
