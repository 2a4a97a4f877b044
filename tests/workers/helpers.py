"""Shared builders for the worker tests: toy batches and configs on the tiny test model."""

from __future__ import annotations

import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.config import ActorConfig, OptimConfig


def make_batch(num_rows: int = 8, prompt_len: int = 6, response_len: int = 5, vocab: int = 300,
               seed: int = 0) -> DataProto:
    """Rows shaped like a rollout: left-padded prompts || right-padded responses (varied lengths),
    plus random advantages; ``old_log_probs``/``ref_log_prob`` are filled in by the tests."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, prompt_len + 1, (num_rows,), generator=g)
    response_lens = torch.randint(1, response_len + 1, (num_rows,), generator=g)
    prompt_mask = (torch.arange(prompt_len)[None] >= prompt_len - prompt_lens[:, None]).long()
    response_mask = (torch.arange(response_len)[None] < response_lens[:, None]).long()
    prompts = torch.randint(3, vocab, (num_rows, prompt_len), generator=g) * prompt_mask
    responses = torch.randint(3, vocab, (num_rows, response_len), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "advantages": torch.randn(num_rows, response_len, generator=g) * response_mask,
    }
    return DataProto.from_dict(tensors, meta_info={"temperature": 0.7})


def actor_config(**overrides) -> ActorConfig:
    """fp32, one mini-batch of 8 rows in micro-batches of rows by default, a visible learning rate, no clipping."""
    kwargs = dict(ppo_mini_batch_size=8, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=8, grad_clip=None,
                  clip_ratio=0.2, optim=OptimConfig(lr=1e-2, weight_decay=0.0))
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


def hf_response_log_probs(model, batch: DataProto, temperature: float) -> torch.Tensor:
    """Reference: full-sequence HF forward, log-softmax, gather the response tokens [B, R]."""
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits
    r = b["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -r - 1:-1].float() / temperature, dim=-1)
    return logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def ppo_batch(model, **kw) -> DataProto:
    """``make_batch(**kw)`` with ``old_log_probs`` and ``ref_log_prob`` near ``model``'s own (T = 0.7):
    the old policy slightly off the current one so ratios and clipping are exercised."""
    data = make_batch(**kw)
    lp = hf_response_log_probs(model, data, 0.7)
    g = torch.Generator().manual_seed(1)
    data.batch["old_log_probs"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    data.batch["ref_log_prob"] = lp + 0.1 * torch.randn(lp.shape, generator=g)
    return data
