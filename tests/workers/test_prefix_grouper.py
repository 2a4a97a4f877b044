"""Prefix grouper: rows sharing a prompt run it once; log-probs, values and updates are unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers import varlen_attention
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.batching import split_micro_batches
from hybrid_rl.workers.critic import DataParallelPPOCritic
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.packing import computed_tokens, pack, prompt_groups
from tests.workers.helpers import actor_config, hf_response_log_probs, make_batch
from tests.workers.test_critic import _config as critic_config


def grouped_batch(prompts: int = 3, n: int = 3, seed: int = 0) -> DataProto:
    """``prompts`` distinct prompts x ``n`` responses each (GRPO layout: rows of a group adjacent),
    responses of varied lengths, advantages and old/ref log-probs to train on."""
    data = make_batch(num_rows=prompts, seed=seed).select_idxs(torch.arange(prompts).repeat_interleave(n))
    rows, width = prompts * n, data.batch["responses"].shape[1]
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    response_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    responses = torch.randint(3, 300, (rows, width), generator=g) * response_mask
    prompt_cols = data.batch["prompts"].shape[1]
    attention_mask = torch.cat([data.batch["attention_mask"][:, :prompt_cols], response_mask], dim=1)
    data.batch["responses"], data.batch["response_mask"] = responses, response_mask
    data.batch["input_ids"] = torch.cat([data.batch["prompts"], responses], dim=1)
    data.batch["attention_mask"] = attention_mask
    data.batch["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    data.batch["advantages"] = torch.randn(rows, width, generator=g) * response_mask
    data.batch["old_log_probs"] = -torch.rand(rows, width, generator=g)
    data.batch["ref_log_prob"] = -torch.rand(rows, width, generator=g)
    data.meta_info.update(micro_batch_size=rows, use_dynamic_bsz=False)
    return data


@pytest.fixture(params=["batched", "per_block"])
def attention_path(request, monkeypatch):
    """Both forms of the varlen attention: all blocks in batched matmuls, or one SDPA call per block."""
    if request.param == "per_block":
        monkeypatch.setattr(varlen_attention, "DENSE_MAX_SCORES", 0)
    return request.param


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir).double()  # float64: differences are the layout's, not rounding


def test_prompt_groups_and_token_count_by_hand():
    # prompts: [_, 5, 6], [_, 5, 6], [7, 5, 6], [_, 5, 6]; responses of 1, 2, 2, 0 tokens
    input_ids = torch.tensor([[0, 5, 6, 9, 0], [0, 5, 6, 9, 9], [7, 5, 6, 9, 9], [0, 5, 6, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    assert prompt_groups(input_ids, mask, response_length=2) == [[0, 1, 3], [2]]
    # packed: 14 valid tokens; grouped: the 2-token prompt once instead of 3 times -> 10
    groups = prompt_groups(input_ids, mask, response_length=2)
    assert computed_tokens(mask, 2, packed=True) == 14
    assert computed_tokens(mask, 2, packed=True, groups=groups) == 10
    assert computed_tokens(mask, 2, packed=False) == 20
    packed = pack(input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), 2, groups=groups)
    # layout: prompt [5, 6], row 0 [9], row 1 [9, 9], (row 3 empty), prompt [7, 5, 6], row 2 [9, 9]
    assert packed.input_ids.tolist() == [[5, 6, 9, 9, 9, 7, 5, 6, 9, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 2, 3, 0, 1, 2, 3, 4]]
    blocks = packed.attention_kwargs["packed_layout"].blocks
    assert [(b.start, b.end) for b in blocks] == [(0, 5), (5, 10)]
    # prompt (0, 1), row 0 (2), row 1 (3, 4): a response sees the prompt and itself, causally
    assert blocks[0].mask.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                             [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    assert blocks[1].mask.int().tolist() == torch.ones(5, 5).tril().int().tolist()
    # predicting positions: last prompt token (shared), then the row's own response tokens
    assert packed.keep.tolist() == [1, 2, 1, 3, 7, 8, 1]
    assert packed.window.tolist() == [[True, True], [True, True], [True, True], [True, False]]


def test_unshared_prompts_keep_the_row_layout():
    data = make_batch()
    b = data.batch
    groups = prompt_groups(b["input_ids"], b["attention_mask"], 5)
    packed = pack(b["input_ids"], b["attention_mask"], b["position_ids"], 5, groups=groups)
    assert "cu_seq_lens_q" in packed.attention_kwargs  # flash-attention's varlen layout


def test_log_probs_and_entropy_match_the_padded_forward(model, monkeypatch, attention_path):
    data = grouped_batch()
    actor = DataParallelPPOActor(actor_config(), copy.deepcopy(model), use_remove_padding=True)
    assert actor.group_prompts
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[2], k.shape[2]))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(varlen_attention.F, "scaled_dot_product_attention", spy)
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    monkeypatch.undo()
    b, mask = data.batch, data.batch["response_mask"].bool()
    prompt_len = b["attention_mask"][:, :6].sum(-1)
    response_len = b["response_mask"].sum(-1)
    # per layer: one call per prompt group, over the prompt and its 3 responses (or none: batched)
    expected_calls = [(int(prompt_len[i] + response_len[i:i + 3].sum()),) * 2 for i in (0, 3, 6)]
    expected_calls = expected_calls * model.config.num_hidden_layers if attention_path == "per_block" else []
    assert sorted(calls) == sorted(expected_calls)
    assert actor.pop_computed_token_frac() == pytest.approx(
        float(prompt_len[[0, 3, 6]].sum() + response_len.sum()) / float(b["attention_mask"].sum()))
    expected = hf_response_log_probs(model, data, temperature=0.7)
    torch.testing.assert_close(log_probs[mask].float(), expected[mask], atol=0, rtol=1e-6)  # fp32 reference
    padded = DataParallelPPOActor(actor_config(), copy.deepcopy(model))
    padded_log_probs, padded_entropy = padded.compute_log_prob(data, calculate_entropy=True)
    torch.testing.assert_close(log_probs[mask], padded_log_probs[mask], atol=1e-10, rtol=0)
    torch.testing.assert_close(entropy[mask], padded_entropy[mask], atol=1e-10, rtol=0)


def _update(model, data, remove_padding, **cfg):
    model = copy.deepcopy(model)
    config = actor_config(ppo_mini_batch_size=len(data), use_kl_loss=True, kl_loss_coef=0.3,
                          entropy_coeff=0.01, **cfg)
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=1e-2),
                                 use_remove_padding=remove_padding)
    metrics = actor.update_policy(data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def test_update_equals_the_padded_update_and_is_micro_batch_invariant(model, attention_path):
    data = grouped_batch()
    padded, m_padded = _update(model, data, remove_padding=False, ppo_micro_batch_size_per_gpu=9)
    grouped, m_grouped = _update(model, data, remove_padding=True, ppo_micro_batch_size_per_gpu=9)
    # micro-batches of 2 rows split the groups of 3: partly shared, same gradient
    split, _ = _update(model, data, remove_padding=True, ppo_micro_batch_size_per_gpu=2)
    dynamic, _ = _update(model, data, remove_padding=True, use_dynamic_bsz=True,
                         ppo_max_token_len_per_gpu=20, ppo_micro_batch_size_per_gpu=None)
    changed = max((padded[k] - model.state_dict()[k]).abs().max().item() for k in padded)
    assert changed > 1e-4
    for other in (grouped, split, dynamic):
        for name in padded:
            torch.testing.assert_close(other[name], padded[name], atol=1e-10, rtol=0, msg=name)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert m_grouped[key][0] == pytest.approx(m_padded[key][0], abs=1e-10), key
    assert m_grouped["actor/padding_frac"] == [0.0]


def test_dynamic_batches_keep_a_prompts_rows_together():
    data = grouped_batch(prompts=4, n=3)
    b = data.batch
    prompt_len = b["attention_mask"][:, :6].sum(-1)
    group_cost = [int(prompt_len[3 * g] + b["response_mask"][3 * g:3 * g + 3].sum()) for g in range(4)]
    budget = max(group_cost) + 1
    micro, order = split_micro_batches(data, micro_batch_size=None, use_dynamic_bsz=True,
                                       max_token_len=budget, key="k", group_prompts=True)
    for m in micro:
        assert len(m) % 3 == 0  # whole groups only
        groups = prompt_groups(m.batch["input_ids"], m.batch["attention_mask"], 5)
        assert computed_tokens(m.batch["attention_mask"], 5, True, groups) <= budget
    assert sorted(order) == list(range(12))
    # a budget below one group's cost falls back to balancing single rows
    small = max(int(x) for x in b["attention_mask"].sum(-1))
    micro, order = split_micro_batches(data, micro_batch_size=None, use_dynamic_bsz=True,
                                       max_token_len=small, key="k", group_prompts=True)
    assert sorted(order) == list(range(12)) and all(int(m.batch["attention_mask"].sum()) <= small for m in micro)


def test_critic_values_match_the_padded_forward(tiny_model_dir, attention_path):
    from hybrid_rl.workers.model_loader import load_value_model

    value_model = load_value_model(tiny_model_dir).double()
    data = grouped_batch()
    padded = DataParallelPPOCritic(critic_config(), copy.deepcopy(value_model)).compute_values(data)
    critic = DataParallelPPOCritic(critic_config(), value_model, use_remove_padding=True)
    assert critic.group_prompts
    grouped = critic.compute_values(data)
    torch.testing.assert_close(grouped, padded, atol=1e-10, rtol=0)
