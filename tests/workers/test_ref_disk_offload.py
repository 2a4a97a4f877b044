"""ref.disk_offload: a one-process worker's reference reads its weights from a file mapping that
leaves memory after every pass, and computes the same log-probs as a reference held in memory."""

import pytest
import torch

from hybrid_rl.single_controller import RayClassWithInitArgs
from hybrid_rl.single_controller.local import LocalWorkerGroup
from hybrid_rl.workers import ActorRolloutRefWorker
from hybrid_rl.workers.builders import offload_frozen_to_disk
from hybrid_rl.workers.config import ActorRolloutRefConfig, ModelConfig, RefConfig
from tests.workers.helpers import make_batch


def _ref_log_probs(model_dir: str, disk_offload):
    config = ActorRolloutRefConfig(model=ModelConfig(path=model_dir),
                                   ref=RefConfig(log_prob_use_dynamic_bsz=False, log_prob_micro_batch_size_per_gpu=2,
                                                 disk_offload=disk_offload))
    group = LocalWorkerGroup(RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role="ref"))
    try:
        group.init_model()
        batch = make_batch(4, vocab=250)
        first = group.compute_ref_log_prob(batch).batch["ref_log_prob"]
        second = group.compute_ref_log_prob(batch).batch["ref_log_prob"]  # after a release
        breakdown = group.memory_breakdown()[0]
    finally:
        group.shutdown()
    assert not torch.distributed.is_initialized()  # the worker's 1-rank group went with it
    assert torch.equal(first, second)
    return first, breakdown


def test_the_reference_from_a_file_mapping_gives_the_same_log_probs(tiny_model_dir):
    in_memory, kept = _ref_log_probs(tiny_model_dir, False)
    mapped, offloaded = _ref_log_probs(tiny_model_dir, None)  # null = on here (one process, CPU, disk TMPDIR)
    assert torch.equal(mapped, in_memory)
    assert kept["ref/params"] > 0 and kept["ref/params_on_disk"] == 0
    assert offloaded["ref/params"] == 0 and offloaded["ref/params_on_disk"] == kept["ref/params"]


def test_disk_offload_on_a_gpu_is_refused_in_one_line():
    with pytest.raises(ValueError, match="ref.disk_offload=true is for CPU workers.*param_offload=true"):
        offload_frozen_to_disk(torch.nn.Linear(2, 2), True, torch.device("cuda"))
    assert offload_frozen_to_disk(torch.nn.Linear(2, 2), None, torch.device("cuda")) is None


def test_a_memory_tmpdir_keeps_the_reference_in_memory(monkeypatch, caplog):
    import hybrid_rl.workers.builders as builders

    monkeypatch.setattr(builders, "ram_file_system", lambda directory: "tmpfs")
    assert offload_frozen_to_disk(torch.nn.Linear(2, 2), None, torch.device("cpu")) is None
    assert offload_frozen_to_disk(torch.nn.Linear(2, 2), True, torch.device("cpu")) is None
    assert "TMPDIR" in caplog.text and "tmpfs" in caplog.text
    assert offload_frozen_to_disk(torch.nn.Linear(2, 2), False, torch.device("cpu")) is None


def test_a_failed_write_keeps_the_reference_in_memory(monkeypatch, caplog):
    import hybrid_rl.workers.builders as builders

    def full_disk(module, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(builders, "FileMappedWeights", full_disk)
    module = torch.nn.Linear(2, 2)
    before = module.weight.detach().clone()
    assert offload_frozen_to_disk(module, None, torch.device("cpu")) is None  # auto: quietly in memory
    assert offload_frozen_to_disk(module, True, torch.device("cpu")) is None
    assert "No space left on device" in caplog.text and torch.equal(module.weight, before)
