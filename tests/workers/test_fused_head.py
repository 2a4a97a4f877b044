"""``model.use_fused_kernels``: the actor's log-probs, entropies and updates equal the regular head's."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.algorithms import linear_logits
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.config import ModelConfig
from hybrid_rl.workers import fused_head
from hybrid_rl.workers.fused_head import fusable_head, head_returns_log_probs
from hybrid_rl.workers.lora import apply_lora
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.helpers import actor_config, ppo_batch


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(linear_logits, "VOCAB_BLOCK", 64)  # the tiny vocabulary in several blocks


def _pair(tiny_model_dir: str, use_remove_padding: bool, **config) -> tuple[DataParallelPPOActor, ...]:
    plain = load_causal_lm(tiny_model_dir).double()  # float64: the same math without float32 rounding
    fused = copy.deepcopy(plain)
    cfg = actor_config(ppo_micro_batch_size_per_gpu=4, **config)
    # SGD: the step is the gradient, so the parameters compare the gradients
    return tuple(DataParallelPPOActor(cfg, m, torch.optim.SGD(m.parameters(), lr=1.0),
                                      use_remove_padding=use_remove_padding, fused_head=f)
                 for m, f in ((plain, False), (fused, True)))


@pytest.mark.parametrize("use_remove_padding", [True, False])
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_log_probs_entropies_and_the_update_equal_the_regular_heads(tiny_model_dir, use_remove_padding,
                                                                      entropy_coeff, monkeypatch):
    calls = []
    monkeypatch.setattr(fused_head, "linear_logprobs_and_entropy",
                        lambda *a, **k: calls.append(k["entropy"]) or linear_logits.linear_logprobs_and_entropy(*a, **k))
    actors = _pair(tiny_model_dir, use_remove_padding, entropy_coeff=entropy_coeff)
    data = ppo_batch(actors[0].actor_module)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    (lp_p, ent_p), (lp_f, ent_f) = (a.compute_log_prob(data, calculate_entropy=True) for a in actors)
    torch.testing.assert_close(lp_f, lp_p, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent_f, ent_p, rtol=0, atol=1e-12)
    assert calls == ["metric"] * 2  # the fused actor's two micro-batches of 4 rows
    metrics = [a.update_policy(data) for a in actors]
    assert calls[2:] == ["grad" if entropy_coeff else "metric"] * 2
    for key in ("actor/grad_norm", "actor/entropy", "actor/pg_loss"):
        assert metrics[1][key][0] == pytest.approx(metrics[0][key][0], rel=1e-10), key
    modules = [a.actor_module for a in actors]
    for (name, p_p), p_f in zip(modules[0].named_parameters(), modules[1].parameters()):
        torch.testing.assert_close(p_f, p_p, atol=1e-12, rtol=1e-10, msg=name)


def test_a_lora_actor_uses_it_and_its_frozen_head_gets_no_gradient(tiny_model_dir):
    torch.manual_seed(0)
    cfg = ModelConfig(path=tiny_model_dir, lora_rank=4)
    model = apply_lora(load_causal_lm(tiny_model_dir), cfg).double()
    head = fusable_head(model)
    assert head is not None and not head.weight.requires_grad
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter is zero: make its term show
            p.data.normal_(0, 0.1)
    plain = copy.deepcopy(model)
    actors = [DataParallelPPOActor(actor_config(), m, torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=1.0),
                                   use_remove_padding=True, fused_head=f) for m, f in ((plain, False), (model, True))]
    data = ppo_batch(plain)
    data.meta_info.update(micro_batch_size=8, use_dynamic_bsz=False)
    metrics = [a.update_policy(data) for a in actors]
    assert metrics[1]["actor/grad_norm"][0] == pytest.approx(metrics[0]["actor/grad_norm"][0], rel=1e-10)
    assert head.weight.grad is None


def test_only_plain_heads_of_known_model_types_qualify(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    assert fusable_head(model) is model.lm_head
    targeted = apply_lora(load_causal_lm(tiny_model_dir), ModelConfig(path=tiny_model_dir, lora_rank=4,
                                                                        target_modules=["q_proj", "lm_head"]))
    assert fusable_head(targeted) is None  # a LoRA-wrapped head keeps the regular path
    model.config.model_type = "gemma2"  # soft-caps its logits after the head
    assert fusable_head(model) is None


def test_the_heads_own_forward_comes_back_even_after_an_error(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    hidden = torch.randn(1, 3, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="boom"):
        with head_returns_log_probs(model.lm_head, torch.zeros(1, 3, dtype=torch.long), 1.0, None, False):
            assert model.lm_head(hidden).shape == (1, 3, 1)
            raise RuntimeError("boom")
    assert "forward" not in vars(model.lm_head)
    assert model.lm_head(hidden).shape == (1, 3, model.config.vocab_size)
