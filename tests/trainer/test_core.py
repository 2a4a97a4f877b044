"""The trainer core is mode-neutral: a mode is its datasets, steps and log line; the loop, cadence,
checkpoints and resume are the core's. PPO, SFT and RM are siblings on it."""

import dataclasses
import json
import os
from dataclasses import dataclass, field

import torch

from hybrid_rl.trainer.config import BaseTrainerConfig as TrainerConfig, RayInitConfig
from hybrid_rl.trainer.config.run_checks import RunPlan, check_trainer, raise_problems, worker_layout
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from hybrid_rl.trainer.rm.trainer import RMTrainer
from hybrid_rl.trainer.sft.trainer import SFTTrainer
from hybrid_rl.utils.testing import build_byte_tokenizer


@dataclass
class SumData:
    train_batch_size: int = 4
    shuffle: bool = True
    seed: int = 1


@dataclass
class SumConfig:
    """A mode's own config: the core reads only ``trainer``, ``ray_init`` and ``data``'s batching."""

    data: SumData = field(default_factory=SumData)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)])}

    @staticmethod
    def collate_fn(items):
        return {"x": torch.stack([item["x"] for item in items])}


class _Saver:
    """A worker group stand-in: its 'model' is the running sum of the rows it was updated on."""

    def __init__(self):
        self.total = 0.0

    def save_checkpoint(self, path, global_step):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "sum.json"), "w") as f:
            json.dump(self.total, f)

    def load_checkpoint(self, path):
        with open(os.path.join(path, "sum.json")) as f:
            self.total = json.load(f)


class SumMode(TrainerCore):
    """A whole mode in a few lines: one step that adds the batch to a sum."""

    def __init__(self, config):
        super().__init__(config, tokenizer=build_byte_tokenizer())  # no model folder is read

    def _typed_config(self, config):
        return config

    def check_config(self, training):
        raise_problems(check_trainer(self.config))

    def make_plan(self):
        device, world, threads = worker_layout(self.config)
        return RunPlan(device, world, use_critic=False, use_reference_policy=False, threads_per_worker=threads)

    def _build_tokenizer(self):
        raise AssertionError("given")

    def _report_precision(self):
        return "float32"

    def _datasets(self, train_dataset, val_dataset):
        return _Rows(12), None

    def _checkpoint_bytes(self):
        return 1024

    def init_workers(self):
        self.group = getattr(self, "group", _Saver())
        self.workers = None

    def step_plan(self):
        return ["add"] + self.cadence_steps()

    def add(self, batch, metrics):
        self.group.total += float(batch.batch["x"].sum())
        metrics["sum"] = self.group.total
        return batch

    def run_validation(self):
        return {}

    def log(self, batch, metrics, timing):
        return self._publish(metrics)

    def _checkpoint_parts(self):
        return [("sum", self.group)]


def _cfg(run_dir, **trainer):
    settings = dict(default_local_dir=str(run_dir), total_training_steps=5, save_freq=2, progress_bar=False,
                    plot=False, logger=["jsonl"])
    return SumConfig(trainer=dataclasses.replace(TrainerConfig(), **{**settings, **trainer}))


def test_the_modes_are_siblings_on_the_core():
    for mode in (RayPPOTrainer, SFTTrainer, RMTrainer):
        assert issubclass(mode, TrainerCore)
    assert not issubclass(SFTTrainer, RayPPOTrainer) and not issubclass(RMTrainer, RayPPOTrainer)


def test_a_mode_gets_the_loop_cadence_checkpoints_and_resume(tmp_path):
    straight = SumMode(_cfg(tmp_path / "a"))
    last = straight.fit()
    # 12 rows in batches of 4 = 3 per epoch, 5 steps cycle into epoch 2; shuffled, so compare sums only
    assert straight.global_steps == 5 and last["training/global_step"] == 5
    assert sorted(os.listdir(tmp_path / "a")) == ["global_step_4", "global_step_5", "latest_checkpointed_iteration.txt",
                                                  "metrics.jsonl", "timeline.jsonl"]
    # a run cut after step 2 resumes from its checkpoint and ends where the straight run ended
    cut = SumMode(_cfg(tmp_path / "b", total_training_steps=2))
    cut.fit()
    resumed = SumMode(_cfg(tmp_path / "b"))
    assert resumed.fit()["sum"] == last["sum"] and resumed.global_steps == 5


def test_the_step_plan_tail_is_the_cadence(tmp_path):
    mode = SumMode(_cfg(tmp_path, test_freq=2))
    mode.global_steps = 2
    assert mode.step_plan() == ["add", "save_checkpoint"]  # no validation data: no validate
    mode.global_steps = 5
    assert mode.step_plan() == ["add", "save_checkpoint"]  # the last step always saves
    mode.global_steps = 3
    assert mode.step_plan() == ["add"]
