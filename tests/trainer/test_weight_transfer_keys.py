"""``async_training.weight_transport`` and ``async_training.update_weights_bucket_megabytes``: validated when the
config is built (one line naming the key and the fix), and what the decoupled trainer's weight export is called
with (a stand-in trainer group records the call; no Ray)."""

from types import SimpleNamespace

import pytest

from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.ppo.decoupled import DecoupledPPOTrainer
from hybrid_rl.workers.weight_transfer import DEFAULT_BUCKET_BYTES


@pytest.fixture(autouse=True)
def _fresh_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run folder is relative: no checkpoint of another run is seen


def _cfg(*overrides):
    return to_ppo_config(get_config(["async_training.enable=true", *overrides]))


@pytest.mark.parametrize("override, message", [
    ("async_training.weight_transport=nccl",
     r"^async_training.weight_transport='nccl' is invalid: must be one of \('auto', 'shm', 'object_store'\)\. "
     r"Fix: use auto \(shm on one node, the object store across nodes\)\.$"),
    ("async_training.update_weights_bucket_megabytes=0",
     r"^async_training.update_weights_bucket_megabytes=0 is invalid: must be an integer >= 1 \(MiB per weight "
     r"bucket\)\. Fix: use e\.g\. 512 \(veRL's default\)\.$"),
    ("async_training.update_weights_bucket_megabytes=-4", r"update_weights_bucket_megabytes=-4 is invalid"),
])
def test_a_bad_transport_or_bucket_size_is_one_line_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message) as info:
        _cfg(override)
    assert "\n" not in str(info.value)


class _TrainerGroup:
    """The trainer group's weight-export surface; records each export's keyword arguments."""

    def __init__(self, node_ip):
        self.worker_infos = [SimpleNamespace(node_ip=node_ip)]
        self.exports = []

    def export_rollout_weights(self, **kwargs):
        self.exports.append(kwargs)
        return [{"weights": SimpleNamespace(push_id=len(self.exports))}]

    def release_rollout_weights(self, handle):
        return None


def _export(cfg, trainer_node, rollout_node):
    trainer = DecoupledPPOTrainer.__new__(DecoupledPPOTrainer)  # the export path alone: no workers, no Ray
    trainer.config = cfg
    trainer.workers = SimpleNamespace(actor_rollout=_TrainerGroup(trainer_node),
                                      rollout=SimpleNamespace(worker_infos=[SimpleNamespace(node_ip=rollout_node)]))
    handle = trainer._export_weights()
    assert trainer.weight_pushes.pending == [handle.push_id]
    return trainer.actor_rollout_wg.exports


def test_the_keys_reach_the_export_call():
    # defaults: 512 MiB (the exporter's own default, veRL's 512) and auto: shm on one node, the object store across
    assert _export(_cfg(), "10.0.0.1", "10.0.0.1") == [{"transport": "shm", "bucket_bytes": DEFAULT_BUCKET_BYTES}]
    assert DEFAULT_BUCKET_BYTES == 512 * 1024 * 1024
    assert _export(_cfg(), "10.0.0.1", "10.0.0.2") == [{"transport": "object_store", "bucket_bytes": 512 << 20}]
    forced = _cfg("async_training.weight_transport=object_store", "async_training.update_weights_bucket_megabytes=3")
    assert _export(forced, "10.0.0.1", "10.0.0.1") == [{"transport": "object_store", "bucket_bytes": 3 * 1024 * 1024}]
    assert _export(_cfg("async_training.weight_transport=shm"), "10.0.0.1", "10.0.0.2")[0]["transport"] == "shm"
