"""Model merger: worker checkpoint (full or FSDP2-sharded layout) -> HF folder with the same greedy text."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybrid_rl.model_merger import main, merge_checkpoint, merge_shards
from hybrid_rl.workers.checkpoint import save_checkpoint


def _greedy(model, tokenizer, text="<|im_start|>user\nhi<|im_end|>\n", n=12):
    ids = tokenizer(text, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture()
def model_and_tokenizer(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_full_checkpoint_round_trip(tmp_path, model_and_tokenizer):
    model, tok = model_and_tokenizer
    with torch.no_grad():  # make it differ from the folder it was loaded from
        model.model.embed_tokens.weight.mul_(1.5)
    ckpt = tmp_path / "global_step_3" / "actor"
    save_checkpoint(str(ckpt), model=model, hf_config=model.config, tokenizer=tok,
                    contents=("model",), state_dict_type="full", global_step=3)
    main(["--local_dir", str(ckpt), "--target_dir", str(tmp_path / "hf")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, tensor in model.state_dict().items():
        assert torch.equal(merged.state_dict()[name], tensor), name
    assert _greedy(merged, AutoTokenizer.from_pretrained(tmp_path / "hf")) == _greedy(model, tok)


def test_sharded_layout_is_reassembled(tmp_path, model_and_tokenizer):
    model, tok = model_and_tokenizer
    ckpt = tmp_path / "actor"
    (ckpt / "huggingface").mkdir(parents=True)
    model.config.save_pretrained(ckpt / "huggingface")
    tok.save_pretrained(ckpt / "huggingface")
    world = 3  # uneven: 2-layer dims do not all divide by 3, like FSDP2's torch.chunk layout
    for rank in range(world):
        local = {}
        for name, t in model.state_dict().items():
            chunks = torch.chunk(t, world, dim=0)
            local[name] = chunks[rank].clone() if rank < len(chunks) else t.new_empty((0, *t.shape[1:]))
        save_file(local, str(ckpt / f"model_world_{world}_rank_{rank}.safetensors"))
    (ckpt / "checkpoint_meta.json").write_text(json.dumps(
        {"world_size": world, "model_saved_as": "sharded", "contents": ["model"], "global_step": 1}))
    merge_checkpoint(str(ckpt), str(tmp_path / "hf"), dtype="bfloat16")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    for name, tensor in model.state_dict().items():
        assert torch.equal(merged.state_dict()[name], tensor.to(torch.bfloat16).float()), name
    assert os.path.exists(tmp_path / "hf" / "tokenizer.json")


def test_merge_shards_rejects_mismatch():
    with pytest.raises(ValueError, match="re-assemble to"):
        merge_shards([{"w": torch.zeros(2, 3)}, {"w": torch.zeros(2, 3)}], {"w": torch.Size([5, 3])})
    with pytest.raises(ValueError, match="in no shard"):
        merge_shards([{}], {"w": torch.Size([1])})


def test_incomplete_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "actor").mkdir()
    with pytest.raises(SystemExit, match="not a complete worker checkpoint"):
        main(["--local_dir", str(tmp_path / "actor"), "--target_dir", str(tmp_path / "out")])
