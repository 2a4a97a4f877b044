"""The trainer core is mode-neutral: a mode is its datasets, steps and log line; the loop, cadence,
checkpoints and resume are the core's. PPO, SFT and RM are siblings on it."""

import json
import os

import torch

from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
from hybrid_rl.trainer.rm_trainer import RMTrainer
from hybrid_rl.trainer.sft_trainer import SFTTrainer
from hybrid_rl.utils.testing import build_byte_tokenizer


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


def _cfg(run_dir, *extra):
    return to_ppo_config(get_config([f"trainer.default_local_dir={run_dir}", "data.train_batch_size=4",
                                     "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=5",
                                     "trainer.save_freq=2", "trainer.progress_bar=false", "trainer.plot=false",
                                     "trainer.logger=[jsonl]", *extra]))


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
                                                  "metrics.jsonl"]
    # a run cut after step 2 resumes from its checkpoint and ends where the straight run ended
    cut = SumMode(_cfg(tmp_path / "b", "trainer.total_training_steps=2"))
    cut.fit()
    resumed = SumMode(_cfg(tmp_path / "b"))
    assert resumed.fit()["sum"] == last["sum"] and resumed.global_steps == 5


def test_the_step_plan_tail_is_the_cadence(tmp_path):
    mode = SumMode(_cfg(tmp_path, "trainer.test_freq=2"))
    mode.global_steps = 2
    assert mode.step_plan() == ["add", "save_checkpoint"]  # no validation data: no validate
    mode.global_steps = 5
    assert mode.step_plan() == ["add", "save_checkpoint"]  # the last step always saves
    mode.global_steps = 3
    assert mode.step_plan() == ["add"]
