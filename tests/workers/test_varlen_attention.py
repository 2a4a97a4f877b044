"""Varlen attention on packed rows: same outputs as the padded batch, and no [T, T] mask used."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.workers import varlen_attention
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, make_batch


def test_cu_seq_lens():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    assert varlen_attention.cu_seq_lens(mask).tolist() == [0, 2, 5, 6]


def test_packed_log_probs_use_varlen_and_match_padded(tiny_model_dir, monkeypatch):
    model = load_causal_lm(tiny_model_dir)
    padded_actor = DataParallelPPOActor(actor_config(), copy.deepcopy(model))
    packed_actor = DataParallelPPOActor(actor_config(), model, use_remove_padding=True)
    assert model.config._attn_implementation == varlen_attention.VARLEN_ATTENTION
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[2], attn_mask is None, kw.get("is_causal")))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(varlen_attention.F, "scaled_dot_product_attention", spy)
    data = make_batch()
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    packed, ent_packed = packed_actor.compute_log_prob(data, calculate_entropy=True)
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    num_layers = model.config.num_hidden_layers
    # one maskless causal call per row and layer, each as long as that row
    assert sorted(c[0] for c in calls) == sorted(lengths * num_layers)
    assert all(no_mask and causal for _, no_mask, causal in calls)
    padded, ent_padded = padded_actor.compute_log_prob(data, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(packed[mask], padded[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_packed[mask], ent_padded[mask], atol=1e-5, rtol=0)


def test_non_sdpa_models_are_left_alone(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    model.set_attn_implementation("eager")
    assert not varlen_attention.use_varlen_attention(model)
    assert model.config._attn_implementation == "eager"
