"""Model forward passes that return per-response-token quantities, shared by actor and critic.

A row is ``prompt (left-padded, P) || response (right-padded, R)``; the token ``responses[:, r]``
sits at column ``P + r`` and is predicted by the output at column ``P + r - 1``. So the outputs
needed are the columns ``[L - R - 1, L - 1)``; only those go through the LM head
(``logits_to_keep``), which saves a vocab-sized matmul per prompt token.

With ``use_remove_padding`` the valid tokens of all rows are packed into one sequence of shape
``[1, T]`` without an attention mask (:mod:`hybrid_rl.workers.packing`), and the row boundaries
are passed as ``cu_seq_lens_q``: the varlen attention (:mod:`hybrid_rl.workers.varlen_attention`,
switched on by the actor/critic) attends within each row, so no compute is spent on padding. A
model left on plain ``sdpa`` rebuilds a block-diagonal causal mask from the ``position_ids``
restarting at 0 instead. ``groups`` (the prefix grouper) also runs each prompt shared by several
rows only once; it needs the varlen attention.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from hybrid_rl.algorithms import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits
from hybrid_rl.workers.packing import PackedBatch, computed_tokens, first_valid_column, pack


def trim_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Drop leading columns that are padding in every row (exact: they are masked anyway)."""
    start = first_valid_column(attention_mask)
    return input_ids[:, start:], attention_mask[:, start:], position_ids[:, start:]


def padding_fraction(attention_mask: torch.Tensor, use_remove_padding: bool) -> float:
    """Share of the tokens a forward pass over this micro-batch computes that are padding.

    Packed micro-batches compute no padding; padded ones compute ``[B, L']`` with ``L'`` the width
    left after :func:`trim_left_padding`.
    """
    if use_remove_padding:
        return 0.0
    computed = computed_tokens(attention_mask, 0, packed=False)
    return 1.0 - float(attention_mask.sum()) / computed if computed else 0.0


def _pack(batch: dict[str, torch.Tensor], groups: Optional[list[list[int]]]) -> PackedBatch:
    input_ids, attention_mask, position_ids = trim_left_padding(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    return pack(input_ids, attention_mask, position_ids, batch["responses"].shape[1], groups)


def response_logits(module: nn.Module, batch: dict[str, torch.Tensor], use_remove_padding: bool,
                    groups: Optional[list[list[int]]] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Logits predicting each response token (before the sampling temperature is applied).

    Returns ``(logits, window)``: padded path ``logits`` is ``[B, R, V]`` and ``window`` None;
    packed path ``logits`` is ``[N, V]`` for the valid positions marked by ``window [B, R]``.
    ``groups`` (:func:`~hybrid_rl.workers.packing.prompt_groups`; packed path, varlen attention
    only) runs each shared prompt once.
    """
    response_length = batch["responses"].shape[1]
    if use_remove_padding:
        packed = _pack(batch, groups)
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                     use_cache=False, logits_to_keep=packed.keep, **packed.attention_kwargs)
        return out.logits[0], packed.window  # [N, V]
    input_ids, attention_mask, position_ids = trim_left_padding(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False, logits_to_keep=response_length + 1)
    return out.logits[:, :-1, :], None  # [B, R, V]


def _unpack(values: torch.Tensor, window: Optional[torch.Tensor]) -> torch.Tensor:
    """``[N]`` packed values -> ``[B, R]`` with zeros outside the window (padded path: as is)."""
    if window is None:
        return values
    out = values.new_zeros(window.shape)
    out[window] = values
    return out


def response_log_probs(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                       use_remove_padding: bool, calculate_entropy: bool, entropy_grad: bool = True,
                       groups: Optional[list[list[int]]] = None
                       ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [B, R], entropy [B, R] | None)`` of the response tokens (float32) under
    ``softmax(logits / temperature)``.

    ``entropy_grad=False`` computes the entropy outside autograd (a metric only), in the same pass
    over the logits as the log-probs; its backward, a second vocab-sized pass per response token,
    is then skipped.
    """
    logits, window = response_logits(module, batch, use_remove_padding, groups)
    labels = batch["responses"] if window is None else batch["responses"][window]
    if calculate_entropy and not (entropy_grad and torch.is_grad_enabled()):
        log_probs, entropy = logprobs_and_entropy_from_logits(logits, labels, temperature=temperature)
        return _unpack(log_probs, window), _unpack(entropy, window)
    log_probs = _unpack(logprobs_from_logits(logits, labels, temperature=temperature), window)
    entropy = _unpack(entropy_from_logits(logits, temperature=temperature), window) if calculate_entropy else None
    return log_probs, entropy


def response_values(module: nn.Module, batch: dict[str, torch.Tensor],
                    use_remove_padding: bool, groups: Optional[list[list[int]]] = None) -> torch.Tensor:
    """Critic values ``[B, R]`` (float32): the value head at the columns predicting each response
    token, i.e. the value of the state before that token is generated."""
    response_length = batch["responses"].shape[1]
    if use_remove_padding:
        packed = _pack(batch, groups)
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                     use_cache=False, **packed.attention_kwargs)
        return _unpack(out.logits[0, packed.keep, 0].float(), packed.window)
    input_ids, attention_mask, position_ids = trim_left_padding(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False)
    length = input_ids.shape[1]
    return out.logits[:, length - response_length - 1:length - 1, 0].float()  # [B, R]


def last_valid_columns(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` long: the column of each row's last valid token (``attention_mask`` ``[B, L]``)."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (columns * attention_mask.bool()).argmax(-1)


def sequence_scores(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, use_remove_padding: bool) -> torch.Tensor:
    """Scalar scores ``[B]`` (float32) of whole sequences: a one-output token-classification
    model's output at each row's last valid token (veRL's reward-model read-out; what
    ``AutoModelForSequenceClassification`` pools when that token is not the pad token).

    Rows ``[B, L]`` may be padded on either side. Packed, the valid tokens of all rows form one
    ``[1, T]`` sequence and row ``i`` ends at packed index ``cumsum(lengths)[i] - 1``.
    """
    input_ids, attention_mask, position_ids = trim_left_padding(input_ids, attention_mask, position_ids)
    if use_remove_padding:
        packed = pack(input_ids, attention_mask, position_ids, response_length=0)
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                     use_cache=False, **packed.attention_kwargs)
        ends = attention_mask.sum(-1).cumsum(0) - 1  # [B]
        return out.logits[0, ends, 0].float()
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return out.logits[rows, last_valid_columns(attention_mask), 0].float()
