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

from typing import Any, Optional

import torch
from torch import nn

from hybrid_rl.algorithms import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits
from hybrid_rl.utils.profiling import phase
from hybrid_rl.workers.fused_head import entropy_mode, fusable_head, head_returns_log_probs
from hybrid_rl.workers.fsdp_utils import to_device
from hybrid_rl.workers.packing import PackedBatch, computed_tokens, first_valid_column, pack
from hybrid_rl.workers.varlen_attention import VARLEN_ATTENTION


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


def _packed_inputs(batch: dict[str, torch.Tensor], groups: Optional[list[list[int]]],
                   device: torch.device) -> tuple[PackedBatch, torch.Tensor, torch.Tensor]:
    """``(packed batch, window index [N], host index [N])``: the first two on ``device``, all built
    where ``batch`` lives (the host, in the workers: the layout's bookkeeping never waits on the
    accelerator). The host index selects the labels, ``batch["responses"].reshape(-1)[index]``."""
    packed = _pack(batch, groups)
    index = packed.window_index  # [N] flat [B * R] positions of the predicted response tokens
    return packed.to(device), to_device(index, device), index


def _padded_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(input_ids, attention_mask, position_ids)`` ``[B, L']`` on ``device``, leading all-padding
    columns dropped on the host."""
    trimmed = trim_left_padding(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    return tuple(to_device(t, device) for t in trimmed)


def packed_attention_mask(module: nn.Module, device: torch.device) -> Optional[torch.Tensor]:
    """The ``attention_mask`` of a packed forward: for a model on the varlen attention (which reads
    the layout from ``packed_layout`` / ``cu_seq_lens_q``) an empty 4-D mask, which HF passes through
    as is, so it neither builds a ``[1, 1, T, T]`` mask nobody reads nor checks the positions for
    packed rows (a device sync); None for a model on another attention, which needs HF's mask
    rebuilt from the restarting ``position_ids``."""
    config = getattr(module, "config", None)
    if getattr(config, "_attn_implementation", None) != VARLEN_ATTENTION:
        return None
    return torch.ones(1, 1, 0, 0, dtype=torch.bool, device=device)


def _unpack(values: torch.Tensor, index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N]`` packed values -> ``shape`` ``[B, R]`` with zeros outside the window (``index``: the
    flat positions of the values; a scatter, differentiable in ``values``)."""
    return values.new_zeros(shape.numel()).scatter(0, index, values).view(shape)


def response_inputs(module: nn.Module, batch: dict[str, torch.Tensor], use_remove_padding: bool,
                    groups: Optional[list[list[int]]], device: torch.device
                    ) -> tuple[dict[str, Any], torch.Tensor, Optional[torch.Tensor]]:
    """``(model kwargs, labels [N], index [N] | None)`` of a forward whose logits predict the response
    tokens: packed (``index``: their flat ``[B * R]`` positions; the logits are ``[1, N, V]``) or
    left-trimmed padded rows (``index`` None; the logits are ``[B, R + 1, V]``, the last column unused)."""
    shape = batch["responses"].shape
    if use_remove_padding:
        packed, index, host_index = _packed_inputs(batch, groups, device)
        labels = to_device(batch["responses"].reshape(-1)[host_index], device)
        inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids,
                      attention_mask=packed_attention_mask(module, device), logits_to_keep=packed.keep,
                      **packed.attention_kwargs)
        return inputs, labels, index
    input_ids, attention_mask, position_ids = _padded_inputs(batch, device)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  logits_to_keep=shape[1] + 1)
    return inputs, to_device(batch["responses"], device).reshape(-1), None


def response_log_probs(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                       use_remove_padding: bool, calculate_entropy: bool, entropy_grad: bool = True,
                       groups: Optional[list[list[int]]] = None, device: Optional[torch.device] = None,
                       fused_head: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [B, R], entropy [B, R] | None)`` of the response tokens (float32) under
    ``softmax(logits / temperature)``, on ``device`` (default: where ``batch`` is).

    The model inputs are packed (``use_remove_padding``; ``groups``: the prefix grouper runs each
    shared prompt once, varlen attention only) or trimmed where ``batch`` lives and then moved, so
    a host batch costs the device no synchronisation. Only the columns predicting a response token
    go through the LM head (``logits_to_keep``). ``entropy_grad=False`` computes the entropy outside
    autograd (a metric only), in the same pass over the logits as the log-probs; its backward, a
    second vocab-sized pass per response token, is then skipped. ``fused_head``: the LM head returns
    the log-probs itself where the model allows it (:mod:`hybrid_rl.workers.fused_head`), so no
    ``[N, V]`` logits or logit gradients are held.
    """
    device = torch.device(device) if device is not None else batch["input_ids"].device
    shape = batch["responses"].shape
    with phase("inputs"):
        inputs, labels, index = response_inputs(module, batch, use_remove_padding, groups, device)
    if use_remove_padding:
        place = lambda values: _unpack(values, index, shape)  # noqa: E731
    else:
        labels, place = labels.view(shape), lambda values: values
    head = fusable_head(module) if fused_head else None
    mode = entropy_mode(calculate_entropy, entropy_grad)
    if head is not None:
        with phase("model"), head_returns_log_probs(head, labels, temperature, mode,
                                                    drop_last=not use_remove_padding):
            out = module(use_cache=False, **inputs).logits  # [1, N, k] packed, [B, R, k] padded
        out = out[0] if use_remove_padding else out
        return place(out[..., 0]), (place(out[..., 1]) if mode else None)
    with phase("model"):
        logits = module(use_cache=False, **inputs).logits
    logits = logits[0] if use_remove_padding else logits[:, :-1, :]  # [N, V] packed, [B, R, V] padded
    with phase("log_probs"):
        if mode == "metric":  # the entropy from the log-probs' own pass, outside autograd
            log_probs, entropy = logprobs_and_entropy_from_logits(logits, labels, temperature=temperature)
            return place(log_probs), place(entropy)
        log_probs = place(logprobs_from_logits(logits, labels, temperature=temperature))
        entropy = place(entropy_from_logits(logits, temperature=temperature)) if mode == "grad" else None
    return log_probs, entropy


def response_values(module: nn.Module, batch: dict[str, torch.Tensor], use_remove_padding: bool,
                    groups: Optional[list[list[int]]] = None, device: Optional[torch.device] = None) -> torch.Tensor:
    """Critic values ``[B, R]`` (float32, on ``device``; default: where ``batch`` is): the value head
    at the columns predicting each response token, i.e. the value of the state before that token
    is generated. Inputs are prepared on the host as in :func:`response_log_probs`."""
    device = torch.device(device) if device is not None else batch["input_ids"].device
    shape = batch["responses"].shape
    if use_remove_padding:
        packed, index, _ = _packed_inputs(batch, groups, device)
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids,
                     attention_mask=packed_attention_mask(module, device), use_cache=False, **packed.attention_kwargs)
        return _unpack(out.logits[0, packed.keep, 0].float(), index, shape)
    input_ids, attention_mask, position_ids = _padded_inputs(batch, device)
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False)
    length = input_ids.shape[1]
    return out.logits[:, length - shape[1] - 1:length - 1, 0].float()  # [B, R]


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
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids,
                     attention_mask=packed_attention_mask(module, input_ids.device), use_cache=False,
                     **packed.attention_kwargs)
        ends = attention_mask.sum(-1).cumsum(0) - 1  # [B]
        return out.logits[0, ends, 0].float()
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return out.logits[rows, last_valid_columns(attention_mask), 0].float()
