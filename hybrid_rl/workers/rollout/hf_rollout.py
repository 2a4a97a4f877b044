"""Rollout with transformers ``generate`` (any device; the fallback when vLLM is unavailable).

The engine owns its own inference copy of the model in the rollout dtype; ``update_weights``
copies the actor's streamed full state dict into it. Sampling warpers (temperature, top-k, top-p)
are passed to ``generate`` as our own logits-processor list, followed by a recorder, so the
recorded log-probs are those of the distribution each token was actually sampled from — the same
definition as vLLM's ``processed_logprobs``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, Optional

import torch
from transformers import (GenerationConfig, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)

from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.memory import module_bytes
from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.rollout.base import (ROW_SEED_STRIDE, BaseRollout, GenerationParams, PrivateRng,
                                            StrictWeightStream, TurnResults, data_parallel_rank,
                                            expected_weight_shapes)
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.grouped_attention import use_grouped_decode_attention
from hybrid_rl.workers.rollout.sequences import build_rollout_output, eos_cut_length

logger = logging.getLogger(__name__)


class _SampledLogProbRecorder(LogitsProcessor):
    """Last processor of the list: keeps log_softmax of the final scores of step t and, when step
    t+1 starts (its input_ids end with the token sampled at t), gathers that token's log-prob."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # each [B]
        self._pending: Optional[torch.Tensor] = None  # [B, V] log-probs of the last step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def log_probs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[B, T] log-probs of ``new_tokens`` [B, T] (the tokens generate returned)."""
        steps = list(self.steps[: new_tokens.shape[1]])
        if len(steps) < new_tokens.shape[1]:  # the final step is gathered from the output
            assert self._pending is not None and len(steps) == new_tokens.shape[1] - 1
            steps.append(self._pending.gather(1, new_tokens[:, -1:]).squeeze(1))
        return torch.stack(steps, dim=1) if steps else new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)


def _warpers(params: GenerationParams) -> list[LogitsProcessor]:
    """Sampling warpers in transformers' own order; none for greedy decoding."""
    if not params.do_sample:
        return []
    warpers: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p))
    return warpers


def _left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [b, T] of token lists, left-padded to the longest."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
        attention_mask[i, width - len(r):] = 1
    return input_ids, attention_mask


class HFRollout(BaseRollout):
    """Batched transformers ``generate``, micro-batched by ``max_num_seqs`` rows."""

    name = "hf"

    def __init__(self, config: RolloutConfig, model_path: str, tokenizer: Any, device: str = "cpu",
                 trust_remote_code: bool = False):
        if config.tensor_model_parallel_size != 1:
            raise ValueError(f"rollout.tensor_model_parallel_size={config.tensor_model_parallel_size} is "
                             "invalid for rollout.name=hf: transformers generate has no tensor parallelism. "
                             "Fix: set it to 1 or use rollout.name=vllm on GPUs.")
        self.config = config
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        dtype = resolve_dtype(config.dtype, self.device.type, "rollout")
        self.model = load_causal_lm(model_path, dtype=dtype, trust_remote_code=trust_remote_code)
        use_grouped_decode_attention(self.model)  # no per-step copy of the KV cache for GQA models
        self.model.to(self.device)
        self.model.requires_grad_(False)
        self._required, self._optional = expected_weight_shapes(self.model)
        self._dp_rank = data_parallel_rank()
        # Distinct streams per data-parallel rank: ranks holding copies of one prompt must not
        # draw identical samples.
        self._rng = PrivateRng(config.seed + self._dp_rank, cuda=self.device.type == "cuda")
        self.init_agents()

    def generate_batch(self, prompts: DataProto, params: GenerationParams) -> DataProto:
        """The padded prompt tensors in micro-batches of ``max_num_seqs`` rows, as they come."""
        input_ids = prompts.batch["input_ids"]  # [B, P]
        attention_mask = prompts.batch["attention_mask"]  # [B, P]
        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        step = self.config.max_num_seqs
        call_seed = None if params.seed is None else params.seed + ROW_SEED_STRIDE * self._dp_rank
        with self._rng.active(call_seed), torch.no_grad():
            for start in range(0, input_ids.shape[0], step):
                tokens, lps = self._generate_micro_batch(
                    input_ids[start:start + step], attention_mask[start:start + step], params)
                responses.extend(tokens.tolist())
                log_probs.extend(lps.tolist())
        return build_rollout_output(prompts, responses, params,
                                    log_probs if self.config.calculate_log_probs else None)

    def generate_turn(self, token_lists: list[list[int]], max_tokens: list[int],
                      params: GenerationParams) -> TurnResults:
        """One model turn per row (multi-turn): rows left-padded into micro-batches of ``max_num_seqs``,
        each row's new tokens cut after its first EOS and at ``max_tokens[i]``."""
        call_seed = None if params.seed is None else params.seed + ROW_SEED_STRIDE * self._dp_rank
        out: list[tuple[list[int], list[float]]] = []
        step = self.config.max_num_seqs
        with self._rng.active(call_seed), torch.no_grad():
            for start in range(0, len(token_lists), step):
                rows, limits = token_lists[start:start + step], max_tokens[start:start + step]
                input_ids, attention_mask = _left_pad(rows, params.pad_token_id)
                tokens, lps = self._generate_micro_batch(
                    input_ids, attention_mask, dataclasses.replace(params, response_length=max(limits)))
                for row_tokens, row_lps, limit in zip(tokens.tolist(), lps.tolist(), limits):
                    keep = eos_cut_length(row_tokens[:limit], params.eos_token_ids)
                    out.append((row_tokens[:keep], row_lps[:keep] if self.config.calculate_log_probs else []))
        return out

    def _generate_micro_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                              params: GenerationParams) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens [b, T] (T <= response_length) and their log-probs [b, T] for one micro-batch
        (zeros unless ``calculate_log_probs``: the recorder's per-step log_softmax is skipped)."""
        recorder = _SampledLogProbRecorder() if self.config.calculate_log_probs else None
        # A fresh GenerationConfig so the model folder's defaults (top_k=50, ...) never leak in;
        # the warpers are ours (temperature 1 / top_k 0 / top_p 1 keep generate from adding its own).
        # Greedy decoding takes no top_k: transformers warns on the console about a sampling-only flag.
        gen_config = GenerationConfig(
            max_new_tokens=params.response_length, do_sample=params.do_sample, temperature=1.0,
            top_k=0 if params.do_sample else None, top_p=1.0, eos_token_id=list(params.eos_token_ids),
            pad_token_id=params.pad_token_id, bos_token_id=None, use_cache=True, **self._cache_settings())
        output = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
            generation_config=gen_config,
            logits_processor=LogitsProcessorList(_warpers(params) + ([recorder] if recorder is not None else [])))
        new_tokens = output[:, input_ids.shape[1]:].cpu()  # [b, T]
        if recorder is None:
            return new_tokens, torch.zeros(new_tokens.shape, dtype=torch.float32)
        return new_tokens, recorder.log_probs(new_tokens.to(self.device)).cpu()

    def _cache_settings(self) -> dict:
        """``generate``'s cache kwargs: a static (preallocated) KV cache on CUDA under ``auto``, which
        transformers decodes with a compiled, CUDA-graphed step (``enforce_eager=true`` keeps it eager)."""
        choice = self.config.hf_cache_implementation
        if choice == "auto":
            choice = "static" if self.device.type == "cuda" else "dynamic"
        if choice == "dynamic":
            return {}
        return {"cache_implementation": "static", "disable_compile": bool(self.config.enforce_eager)}

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the streamed full state dict into the inference model (names and shapes checked)."""
        targets = self.model.state_dict(keep_vars=True)
        stream = StrictWeightStream(named_tensors, self._required, self._optional)
        with torch.no_grad():
            for name, tensor in stream:
                targets[name].data.copy_(tensor.to(device=self.device, dtype=targets[name].dtype))
        stream.check_complete()

    def sleep(self) -> None:
        """On GPU, park the inference copy in host memory while the trainer runs; on CPU the
        weights already live in host memory and nothing moves."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """Move the inference copy back to the device before ``update_weights`` and generation."""
        if self.device.type == "cuda":
            self.model.to(self.device)

    def memory_owners(self, seen: set) -> dict[str, int]:
        """The inference copy of the weights (transformers' KV cache lives only inside a call)."""
        return {"rollout/weights": module_bytes(self.model, seen) if self.model is not None else 0}

    def shutdown(self) -> None:
        """Drop the inference copy of the model."""
        self.model = None
