"""Reward-model training, a mode on the trainer core: ``RMTrainer`` (``main_rm``).

:class:`~hybrid_rl.trainer.core.loop.TrainerCore` gives it the loop, checkpoints, resume, trackers, the
progress bar, the plot and the validate/save cadence. What is its own:

* its config is :class:`~hybrid_rl.trainer.config.supervised.RMConfig` (veRL's SFT keys and the
  pairs' columns); the worker group hosts one :class:`~hybrid_rl.workers.rm_worker.RewardModelWorker`
  per device (the value-model layout, FSDP2, AdamW; its config built by
  :func:`~hybrid_rl.trainer.config.supervised.rm_critic_config`) and nothing else;
* the training set is a :class:`~hybrid_rl.data.reward_data.PreferenceDataset` and each step is
  ``update_reward_model``: one optimizer step on the Bradley-Terry loss of ``data.train_batch_size``
  pairs (minus a per-pair ``margin`` when the data has one);
* ``validate`` scores the held-out pairs: ``val/rm/accuracy`` (chosen scored above rejected; also
  ``val/rm/accuracy/<kind>`` per rejected kind when the pairs name one),
  ``val/rm/loss``, ``margin``, ``chosen_mean`` / ``rejected_mean`` and the score statistics
  ``val/rm/score_mean`` / ``score_std`` over all held-out responses, which are also written into
  the model's config (``mean`` / ``std``, OpenRLHF's names) so RL can normalise the scores the way
  they were measured;
* checkpoints hold ``global_step_N/reward_model``; ``python -m hybrid_rl.model_merger`` turns it into
  a folder ``AutoModelForSequenceClassification`` loads.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import torch

from hybrid_rl.algorithms.reward_loss import bradley_terry_loss, preference_metrics
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import to_typed_config
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.config.supervised import RMConfig, rm_critic_config
from hybrid_rl.trainer.config.supervised_checks import supervised_plan, validate_rm_config
from hybrid_rl.trainer.core import inputs, model_facts, worker_groups
from hybrid_rl.trainer.core.checkpoints import estimate_checkpoint_bytes
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.validation import dataset_batches
from hybrid_rl.trainer.rm.contracts import rm_batch_plan

__all__ = ["RMTrainer", "RM_CHECKPOINT_DIR"]

logger = logging.getLogger(__name__)

RM_CHECKPOINT_DIR = "reward_model"
"""Sub-folder of ``global_step_N`` the reward model is saved in."""


class RMTrainer(TrainerCore):
    """The trainer core whose step is one pairwise reward-model update (see the module docstring).

    Args:
        config: an :class:`RMConfig`, or a DictConfig composed over it (``main_rm``'s :func:`rm_config`).
        tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s.
        worker_cls: the reward-model worker class to use instead of the default one.
    """

    def __init__(self, config, tokenizer=None, *, train_dataset=None, val_dataset=None,
                 worker_cls: Optional[type] = None):
        super().__init__(config, tokenizer, train_dataset=train_dataset, val_dataset=val_dataset,
                         worker_classes=(worker_cls,))
        self.score_stats: Optional[tuple[float, float]] = None  # (mean, std) of the latest scores
        self._stats_step: Optional[int] = None

    # ------------------------------------------------------------------ config
    def _typed_config(self, config: Any) -> RMConfig:
        return to_typed_config(config, RMConfig)

    def check_config(self, training: bool) -> None:
        validate_rm_config(self.config, training=training)
        self.worker_config = rm_critic_config(self.config)  # the worker's config, built from the RM keys

    def make_plan(self) -> RunPlan:
        return supervised_plan(self.config)

    def _build_tokenizer(self) -> Any:
        return inputs.supervised_tokenizer(self.config.model)

    def _report_precision(self) -> str:
        key = "model.fsdp_config.mixed_precision.param_dtype"
        return model_facts.report_precision(self.config, self.plan,
                                           {key: self.config.model.fsdp_config.mixed_precision.param_dtype})

    def _memory_hint(self) -> str:
        return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower "
                f"data.micro_batch_size_per_gpu (now {self.config.data.micro_batch_size_per_gpu} pairs) or "
                "data.max_length, or set model.enable_gradient_checkpointing=true; each run logs "
                "perf/peak_rss_gib/<step>.")

    # ------------------------------------------------------------------ set-up
    def _pairs(self, files: list[str]):
        from hybrid_rl.data.reward_data import PreferenceDataset

        d = self.config.data
        return PreferenceDataset(files, self.tokenizer, prompt_key=d.prompt_key, chosen_key=d.chosen_key,
                                 rejected_key=d.rejected_key, margin_key=d.margin_key, max_length=d.max_length,
                                 truncation=d.truncation, bad_rows=d.bad_rows, max_bad_fraction=d.max_bad_fraction)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        d = self.config.data
        train_files, val_files = supervised_data_files(d, "pairs")
        if train_dataset is None:
            train_dataset = self._pairs(train_files)
        if val_dataset is None and val_files:
            val_dataset = self._pairs(val_files)
        return train_dataset, val_dataset

    def _checkpoint_bytes(self) -> int:
        return estimate_checkpoint_bytes(model_facts.count_model_params(self.worker_config.model),
                                         [list(self.worker_config.checkpoint.save_contents)])

    def init_workers(self) -> None:
        """Start the reward-model worker group (no actor, rollout or reference)."""
        self.workers = worker_groups.build_reward_model_group(
            self.config, self.plan, self.total_training_steps, self.worker_config, worker_cls=self._worker_classes[0],
            call_timeout_s=self.config.trainer.worker_call_timeout_s, log_dir=os.path.join(self.run_dir, "logs"))

    @property
    def rm_wg(self):
        return self.workers.reward_model

    # ------------------------------------------------------------------ steps
    def declare_batch_plan(self) -> BatchPlan:
        return rm_batch_plan()

    def step_plan(self) -> list[str]:
        return ["update_reward_model"] + self.cadence_steps()

    def update_reward_model(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """One optimizer step on the Bradley-Terry loss of this batch of pairs."""
        return self._update(self.rm_wg.update_reward_model, batch, metrics)

    def _pair_scores(self, dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(chosen [N], rejected [N], margin [N])`` scores of every pair of ``dataset``."""
        chosen, rejected, margins = [], [], []
        for batch in dataset_batches(dataset, self.config.data.val_batch_size):
            out = self.rm_wg.compute_pair_scores(batch)
            chosen.append(out.batch["chosen_scores"])
            rejected.append(out.batch["rejected_scores"])
            margins.append(batch.batch["margin"])
        return torch.cat(chosen), torch.cat(rejected), torch.cat(margins)

    def _record_score_stats(self, scores: torch.Tensor) -> dict[str, float]:
        """Keep the mean / std of ``scores`` and write them into the model's config."""
        mean, std = float(scores.mean()), float(scores.std()) if scores.numel() > 1 else 1.0
        std = std if std > 0 else 1.0
        self.score_stats, self._stats_step = (mean, std), self.global_steps
        self.rm_wg.set_score_normalization(mean, std)
        return {"val/rm/score_mean": mean, "val/rm/score_std": std}

    def run_validation(self) -> dict[str, float]:
        """Pairwise accuracy, loss and score statistics of the held-out pairs (see the module docstring)."""
        if self.val_dataset is None:
            return {}
        chosen, rejected, margin = self._pair_scores(self.val_dataset)
        metrics = {f"val/{k}": v for k, v in preference_metrics(chosen, rejected).items()}
        metrics["val/rm/loss"] = float(bradley_terry_loss(chosen, rejected, margin))
        sources = [self.val_dataset[i]["data_source"] for i in range(len(self.val_dataset))]
        for source in sorted(set(sources) - {""}):
            rows = torch.tensor([s == source for s in sources])
            metrics[f"val-core/{source}/rm/accuracy"] = preference_metrics(chosen[rows], rejected[rows])["rm/accuracy"]
        kinds = [pair.kind for pair in getattr(self.val_dataset, "pairs", [])]
        for kind in sorted(set(kinds) - {""}):  # what the model has learned to reject, and what not
            rows = torch.tensor([k == kind for k in kinds])
            metrics[f"val/rm/accuracy/{kind}"] = preference_metrics(chosen[rows], rejected[rows])["rm/accuracy"]
        metrics.update(self._record_score_stats(torch.cat([chosen, rejected])))
        return metrics

    def save_checkpoint(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Score statistics first (from the training pairs when there is no held-out set), then save."""
        if self._stats_step != self.global_steps and self.val_dataset is None:
            chosen, rejected, _ = self._pair_scores(self.train_dataset)
            metrics.update({k.replace("val/", "train/"): v
                            for k, v in self._record_score_stats(torch.cat([chosen, rejected])).items()})
        return super().save_checkpoint(batch, metrics)

    def _checkpoint_parts(self) -> list[tuple[str, Any]]:
        return [(RM_CHECKPOINT_DIR, self.rm_wg)]

    def _driver_state(self) -> dict[str, Any]:
        return {**super()._driver_state(), "rm_score_stats": self.score_stats}

    def _load_driver_state(self, state: dict[str, Any]) -> None:
        stats = state.get("rm_score_stats")
        if stats:
            self.score_stats = (float(stats[0]), float(stats[1]))
            self.rm_wg.set_score_normalization(*self.score_stats)

    # ------------------------------------------------------------------ logging
    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """``train/loss`` (the Bradley-Terry loss), pairs, timings; then the trackers."""
        metrics["train/loss"] = metrics.get("rm/loss", float("nan"))
        metrics["train/pairs"] = float(len(batch))
        metrics.update({f"timing_s/{name}": value for name, value in timing.items()})
        return self._publish(metrics)
