"""Top-K log-probs of the response positions, for ``forward_kl_topk`` distillation.

The teacher's pass (:func:`response_topk`) keeps, per predicted response token, its K most likely
tokens and their log-probs under ``softmax(logits / temperature)``, plus the sampled token's log-prob.
The student's update (:func:`response_log_probs_with_topk`) takes its log-probs of the sampled tokens
and, from the same logits, its log-probs at the teacher's K ids (with gradient). Both take the packed or
padded inputs of :func:`~hybrid_rl.workers.forward.response_log_probs` and never use the fused head:
they need the logits themselves. float32 work is done over blocks of rows.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from hybrid_rl.algorithms import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits
from hybrid_rl.algorithms.distillation import topk_log_probs
from hybrid_rl.workers.forward import response_inputs
from hybrid_rl.workers.fsdp_utils import to_device

__all__ = ["response_log_probs_with_topk", "response_topk"]

BLOCK_ELEMENTS = 1 << 24
"""Logits per float32 block of the top-K pass (64 MiB)."""


def _response_logits(module: nn.Module, batch: dict[str, torch.Tensor], use_remove_padding: bool,
                     groups: Optional[list[list[int]]], device: torch.device):
    """``(logits [N, V], labels [N], flat index [N] into [B * R])`` of the predicted response tokens."""
    inputs, labels, index = response_inputs(module, batch, use_remove_padding, groups, device)
    logits = module(use_cache=False, **inputs).logits
    if use_remove_padding:
        return logits[0], labels, index
    logits = logits[:, :-1, :]
    return logits.reshape(-1, logits.shape[-1]), labels, torch.arange(labels.numel(), device=device)


def _place(values: torch.Tensor, index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N, ...]`` values at flat positions ``index`` of ``shape`` ``[B, R]`` -> ``[B, R, ...]`` (zeros
    elsewhere; differentiable in ``values``)."""
    out = values.new_zeros((shape.numel(), *values.shape[1:]))
    return out.index_copy(0, index, values).view(*shape, *values.shape[1:])


@torch.no_grad()
def response_topk(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float, k: int,
                  use_remove_padding: bool, groups: Optional[list[list[int]]] = None,
                  device: Optional[torch.device] = None, vocab_limit: Optional[int] = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top-K log-probs [B, R, K] float32, their ids [B, R, K], sampled-token log-probs [B, R])``.

    ``vocab_limit``: the K are chosen among ids ``< vocab_limit`` only (the student's logit width, when
    the teacher's is padded wider: a padded id could not be gathered from the student's logits). The
    log-probs stay normalised over the teacher's whole vocabulary, so the K keep their true mass."""
    device = torch.device(device) if device is not None else batch["input_ids"].device
    shape = batch["responses"].shape
    logits, labels, index = _response_logits(module, batch, use_remove_padding, groups, device)
    rows = max(1, BLOCK_ELEMENTS // logits.shape[-1])
    values, ids = [], []
    for start in range(0, logits.shape[0], rows):
        z = logits[start:start + rows].float() / temperature
        log_p = z - torch.logsumexp(z, dim=-1, keepdim=True)  # [rows, V_teacher]
        top = log_p[:, :vocab_limit].topk(k, dim=-1)  # [rows, K], ids < vocab_limit
        values.append(top.values)
        ids.append(top.indices)
    sampled = logprobs_from_logits(logits, labels, temperature=temperature)
    return (_place(torch.cat(values), index, shape), _place(torch.cat(ids), index, shape),
            _place(sampled, index, shape))


def response_log_probs_with_topk(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                                 topk_ids: torch.Tensor, use_remove_padding: bool, entropy_grad: bool,
                                 groups: Optional[list[list[int]]] = None, device: Optional[torch.device] = None,
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log-probs [B, R], entropy [B, R], log-probs at topk_ids [B, R, K])`` of the student, one
    forward, all with gradient (the entropy only when ``entropy_grad``). ``topk_ids``: ``[B, R, K]``."""
    device = torch.device(device) if device is not None else batch["input_ids"].device
    shape = batch["responses"].shape
    logits, labels, index = _response_logits(module, batch, use_remove_padding, groups, device)
    if entropy_grad:
        log_probs = logprobs_from_logits(logits, labels, temperature=temperature)
        entropy = entropy_from_logits(logits, temperature=temperature)
    else:
        log_probs, entropy = logprobs_and_entropy_from_logits(logits, labels, temperature=temperature)
    ids = to_device(topk_ids, device).reshape(shape.numel(), -1).index_select(0, index)  # [N, K]
    topk = topk_log_probs(logits, ids, temperature)
    return _place(log_probs, index, shape), _place(entropy, index, shape), _place(topk, index, shape)
