"""LoRA actor through ``peft``: wrapping, the reference for free, merged weights for the rollout.

With ``actor_rollout_ref.model.lora_rank > 0`` (veRL's switch) the actor is the HF model wrapped by
``peft.get_peft_model`` (``LoraConfig(r, lora_alpha, target_modules, bias="none")``, CAUSAL_LM, no
dropout): the base weights are frozen, only the adapters train and have optimizer state. Because a
fresh adapter is zero (peft initialises ``lora_B`` to 0), the actor starts as the base model, and the
reference policy is the same module with the adapters off (peft's disable flag, set as its own
``disable_adapter()`` does but without touching ``requires_grad``; see :func:`_adapters_off`): no second
copy of the model, as veRL does.

The rollout engines hold plain HF models. After an update they receive the merged weights
``W + scaling * B @ A`` of every LoRA layer (peft's ``merge`` formula, with peft's own ``scaling``,
i.e. ``lora_alpha / r``) under the HF names, streamed one tensor at a time from the FSDP2 shards.
A separate rollout pool (the decoupled mode) instead gets the base weights once and then the adapter
factors alone (:func:`lora_base_weights`, :func:`lora_adapter_weights`; docs/async.md, "Weight transfer").
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterable, Iterator, Optional

import torch
from torch import nn

from hybrid_rl.workers.config import ModelConfig

__all__ = ["lora_enabled", "apply_lora", "reference_context", "merged_lora_weights", "is_lora_model",
           "lora_adapter_weights", "lora_base_weights", "lora_push_config"]

_PEFT_PREFIX = "base_model.model."
LORA_INIT_SEED = 0
"""Seed of the adapters' random initialisation (identical on every rank)."""
LORA_ADAPTER = "default"
"""peft's name of the one adapter."""


def lora_enabled(model_config: ModelConfig) -> bool:
    """veRL's switch: LoRA is on when ``lora_rank > 0``."""
    return model_config.lora_rank > 0


def is_lora_model(module: nn.Module) -> bool:
    """True for a peft-wrapped model (also once FSDP2 has wrapped it)."""
    from peft import PeftModel

    return isinstance(module, PeftModel)


def _target_modules(value: Any) -> Any:
    """``all-linear`` stays a string; a list (also an OmegaConf ListConfig) becomes a plain list."""
    return value if isinstance(value, str) else [str(v) for v in value]


def apply_lora(model: nn.Module, model_config: ModelConfig, key: str = "actor_rollout_ref.model") -> nn.Module:
    """``model`` wrapped with fresh LoRA adapters (base frozen); a target module the model does not
    have is a one-line ``ValueError`` naming ``<key>.target_modules``."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets = _target_modules(model_config.target_modules)
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=model_config.lora_rank, lora_alpha=model_config.lora_alpha,
                        target_modules=targets, lora_dropout=0.0, bias="none")
    fix = "Fix: use all-linear or names of the model's Linear layers, e.g. [q_proj, k_proj, v_proj, o_proj]."
    try:
        # lora_A is drawn at random (lora_B is 0): the same seed on every rank gives every rank the
        # same adapters before FSDP2 shards them, and leaves the caller's RNG untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(LORA_INIT_SEED)
            peft_model = get_peft_model(model, config)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model..."
        raise ValueError(f"{key}.target_modules={targets!r} is invalid: {str(error).splitlines()[0]} {fix}") from None
    unsupported = _unmergeable_layers(peft_model)
    if unsupported:
        raise ValueError(f"{key}.target_modules={targets!r} is invalid: {unsupported[0]} cannot be merged into the "
                         f"rollout's weights here (only untied nn.Linear layers can). {fix}")
    return peft_model


def _unmergeable_layers(peft_model: nn.Module) -> list[str]:
    """LoRA layers that :func:`merged_lora_weights` does not merge: other than a plain ``nn.Linear``
    (embeddings, GPT-2's transposed Conv1D), DoRA or adapter biases, or a tied output layer."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    config = peft_model.peft_config[LORA_ADAPTER]
    tied = bool(getattr(peft_model.config, "tie_word_embeddings", False))
    bad = []
    for name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        plain = isinstance(module, LoraLinear) and not getattr(module, "fan_in_fan_out", False)
        if not plain or config.use_dora or getattr(config, "lora_bias", False) or (tied and name.endswith("lm_head")):
            bad.append(name.removeprefix(_PEFT_PREFIX))
    return bad


def reference_context(module: nn.Module) -> ContextManager:
    """Context in which ``module`` computes the reference policy: the adapters off for a LoRA actor
    (the frozen base weights), nothing for a separate reference model."""
    return _adapters_off(module) if is_lora_model(module) else nullcontext()


@contextmanager
def _adapters_off(module: nn.Module) -> Iterator[None]:
    """Every LoRA layer computes its base layer only, as in peft's ``disable_adapter()``, but the
    adapters' ``requires_grad`` is left alone: peft's context flips it, and FSDP2 reads it when it
    initialises lazily at the first forward; a first forward inside peft's context leaves FSDP2
    without a gradient-reduce dtype ("assign a gradient with dtype BFloat16 to ... Float")."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    previous = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True  # the flag peft's own enable_adapters() sets
    try:
        yield
    finally:
        for layer, flag in zip(layers, previous):
            layer._disable_adapters = flag


def _lora_scalings(module: nn.Module) -> dict[str, float]:
    """``{state-dict prefix of a LoRA layer: peft's scaling}`` (the prefix ends with a dot)."""
    from peft.tuners.lora import LoraLayer

    return {f"{name}.": float(m.scaling[LORA_ADAPTER]) for name, m in module.named_modules()
            if isinstance(m, LoraLayer) and LORA_ADAPTER in m.scaling}


def _hf_name(name: str) -> str:
    """peft state-dict name -> the HF model's name."""
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


def merged_lora_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], module: nn.Module,
                        dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full weights of a LoRA model with every adapter merged, from the stream of its full
    state (``iter_full_state``). The merge is computed in fp32 and cast to ``dtype`` (default fp32).

    Holds at most one layer's base weight and its two adapter factors at a time.
    """
    scalings = _lora_scalings(module)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    with torch.no_grad():
        for name, tensor in named_tensors:
            prefix = next((p for p in scalings if name.startswith(p)), None)
            if prefix is None:
                yield _hf_name(name), tensor if dtype is None else tensor.to(dtype)
                continue
            part = name[len(prefix):]
            if part == "base_layer.bias":
                yield _hf_name(name), tensor if dtype is None else tensor.to(dtype)
                continue
            parts = pending.setdefault(prefix, {})
            parts[part] = tensor
            if len(parts) == 3:
                del pending[prefix]
                base, a, b = (parts["base_layer.weight"], parts[f"lora_A.{LORA_ADAPTER}.weight"],
                              parts[f"lora_B.{LORA_ADAPTER}.weight"])
                merged = base.float() + scalings[prefix] * (b.float() @ a.float())  # [out, in]
                yield _hf_name(prefix + "weight"), merged.to(dtype or torch.float32)
    if pending:
        raise ValueError(f"incomplete LoRA layers in the weight stream: {sorted(pending)}")


def _is_adapter_factor(name: str) -> bool:
    return f".lora_A.{LORA_ADAPTER}." in name or f".lora_B.{LORA_ADAPTER}." in name


def lora_adapter_weights(module: nn.Module, device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """The LoRA A/B factors alone, full (each FSDP2 shard all-gathered: collective, every rank iterates
    to the end) and in their own dtype, under peft's saved-adapter names
    (``base_model.model.<layer>.lora_A.weight``)."""
    from hybrid_rl.workers.fsdp_utils import gather_full_tensor

    for name, tensor in module.state_dict().items():
        if not _is_adapter_factor(name):
            continue
        if hasattr(tensor, "full_tensor"):
            tensor = gather_full_tensor(tensor)
        yield name.replace(f".{LORA_ADAPTER}.", "."), tensor.detach().to(device)


def lora_base_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], module: nn.Module,
                      dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The base weights under the HF names from the full-state stream, adapter factors left out. Every
    tensor is cast to ``dtype`` except an adapted layer's base weight whose cast would lose bits: it
    keeps its own dtype, so the receiver's merge equals :func:`merged_lora_weights` exactly."""
    adapted = tuple(f"{prefix}base_layer.weight" for prefix in _lora_scalings(module))
    for name, tensor in named_tensors:
        if _is_adapter_factor(name):
            continue
        cast = tensor.to(dtype)
        if name.endswith(adapted) and not torch.equal(cast.to(tensor.dtype), tensor):
            cast = tensor
        yield _hf_name(name), cast


def lora_push_config(module: nn.Module, dtype: torch.dtype) -> dict[str, Any]:
    """The adapter's config for an adapters-only push (plain data): ``r``, ``lora_alpha``,
    ``target_modules``, ``scalings`` (per adapted layer: HF weight name, peft's scaling), ``dtype``."""
    config = module.peft_config[LORA_ADAPTER]
    targets = config.target_modules
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
    scalings = tuple((_hf_name(prefix + "weight"), scaling) for prefix, scaling in _lora_scalings(module).items())
    return {"r": int(config.r), "lora_alpha": float(config.lora_alpha), "target_modules": targets,
            "scalings": scalings, "dtype": str(dtype).removeprefix("torch.")}
