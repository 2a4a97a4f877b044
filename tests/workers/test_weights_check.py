"""The header-only weight check a teacher folder gets at start-up: every way a folder fails to load
gives one line naming the key, the file and the fix; a good folder (single file or sharded) passes."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybrid_rl.utils.testing import build_tiny_model_dir
from hybrid_rl.workers.weights_check import weights_problem

KEY = "distillation.teacher_models.teacher_model.model_path"


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("good"), seed=3)


def _copy(good_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(good_dir, folder)
    return folder


def test_a_saved_model_passes(good_dir):
    assert weights_problem(good_dir, KEY) is None


def test_no_weight_file(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    line = weights_problem(str(folder), KEY)
    assert line.startswith(f"{KEY}=") and "has no weights" in line and "\n" not in line


def test_a_truncated_download(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    line = weights_problem(str(folder), KEY)
    assert "model.safetensors cannot be read" in line and "truncated" in line and "\n" not in line


def test_weights_of_another_shape(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2
    (folder / "config.json").write_text(json.dumps(config))
    line = weights_problem(str(folder), KEY)
    assert "other shapes than config.json says" in line and "mlp" in line and "0 of" not in line


def test_missing_tensors_and_a_base_model_prefix(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, folder / "model.safetensors")
    assert weights_problem(str(folder), KEY) is None  # saved from the base model: loads
    dropped = {k: v for k, v in tensors.items() if "layers.1." not in k}
    save_file(dropped, folder / "model.safetensors")
    line = weights_problem(str(folder), KEY)
    assert "tensors are missing (first: model.layers.1." in line


def test_sharded_folders(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_problem(str(folder), KEY) is None
    (folder / "model-00002-of-00002.safetensors").unlink()
    line = weights_problem(str(folder), KEY)
    assert "model-00002-of-00002.safetensors cannot be read (model-00002-of-00002.safetensors is missing)" in line


def test_a_truncated_bin_file(good_dir, tmp_path):
    folder = _copy(good_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin")
    assert weights_problem(str(folder), KEY) is None
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    assert "pytorch_model.bin cannot be read" in weights_problem(str(folder), KEY)
