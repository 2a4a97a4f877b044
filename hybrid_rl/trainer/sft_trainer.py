"""Supervised fine-tuning with the RL trainer's machinery: ``SFTTrainer`` (``main_sft``).

The same :meth:`RayPPOTrainer.fit`, worker group, checkpoints, resume, trackers, progress bar and
plot; the hook points differ:

* the training set is an :class:`~hybrid_rl.data.sft.SFTDataset` (conversations tokenised with a
  loss mask on the assistant turns) and each step is ``update_actor`` on one batch of it with the
  ``sft`` policy loss (the masked negative log-likelihood; ``actor_rollout_ref.actor.policy_loss.loss_mode=sft``),
  so packing, micro-batching, FSDP2 and LoRA are the actor's own;
* ``validate`` reports ``val/sft_loss`` (the held-out token-mean NLL, from the actor's log-prob pass
  over ``data.val_files``) and, through the rollout engine, the trainer's usual generation metrics
  on the prompts of the same rows (``val-core/<data_source>/reward/mean@1``: what a rule scorer
  thinks of what the model now writes, e.g. its format-following rate).
"""

from __future__ import annotations

import logging
from typing import Any

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer import metrics as metric_fns
from hybrid_rl.trainer.ray_trainer import RayPPOTrainer

__all__ = ["SFTTrainer"]

logger = logging.getLogger(__name__)


class SFTTrainer(RayPPOTrainer):
    """:class:`RayPPOTrainer` whose step is one supervised update (see the module docstring)."""

    def __init__(self, config, tokenizer=None, **kwargs: Any):
        super().__init__(config, tokenizer, **kwargs)
        if self.config.actor_rollout_ref.actor.policy_loss.loss_mode != "sft":
            raise ValueError("SFTTrainer trains with actor_rollout_ref.actor.policy_loss.loss_mode=sft; use "
                             "python -m hybrid_rl.trainer.main_sft, which sets it.")

    def _sft_dataset(self, files: list[str]):
        from hybrid_rl.data.sft import SFTDataset

        d = self.config.data
        return SFTDataset(files, self.tokenizer, prompt_key=d.prompt_key, response_key=d.response_key,
                          messages_key=d.multiturn.messages_key if d.multiturn.enable else None,
                          max_length=d.max_length, truncation=d.truncation)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """Train: SFT conversations. Val: the same files read twice, as SFT rows (the loss) and, when
        they carry prompts with a data source and ground truth, as prompts (generation metrics)."""
        from hybrid_rl.trainer import components

        train_files, val_files = components.resolve_data_files(self.config)
        self.sft_val_dataset = self._sft_dataset(val_files) if val_files else None
        if train_dataset is None:
            train_dataset = self._sft_dataset(train_files)
        if val_dataset is None and val_files and not self.config.data.multiturn.enable:
            try:
                val_dataset = components.build_dataset(val_files, self.tokenizer, self.config)
            except ValueError as error:  # no data_source / ground truth: the loss only
                logger.info("SFT validation reports the held-out loss only (%s)", str(error).splitlines()[0])
        return train_dataset, val_dataset

    def step_plan(self) -> list[str]:
        steps = ["update_actor"]
        if self._validation_due():
            steps.append("validate")
        if self._save_due():
            steps.append("save_checkpoint")
        return steps

    def _has_validation_data(self) -> bool:
        return self.val_dataset is not None or self.sft_val_dataset is not None

    def run_validation(self) -> dict[str, float]:
        metrics = self.validation_loss()
        if self.val_dataset is not None:
            metrics.update(super().run_validation())
        return metrics

    def validation_loss(self) -> dict[str, float]:
        """``val/sft_loss``: the held-out token-mean NLL of the assistant tokens."""
        if self.sft_val_dataset is None:
            return {}
        data = self.sft_val_dataset
        size = self.config.data.val_batch_size or len(data)
        total, tokens = 0.0, 0.0
        for start in range(0, len(data), size):
            items = [data[i] for i in range(start, min(start + size, len(data)))]
            batch = DataProto.from_single_dict(data.collate_fn(items))
            log_probs = self.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]  # [B, R]
            mask = batch.batch["response_mask"].to(log_probs.dtype)
            total += float(-(log_probs * mask).sum())
            tokens += float(mask.sum())
        return {"val/sft_loss": total / max(tokens, 1.0)}

    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """``train/loss`` (veRL's SFT name), tokens and timings; then the trackers."""
        metrics["train/loss"] = metrics.get("actor/pg_loss", float("nan"))
        metrics["train/target_tokens"] = float(batch.batch["response_mask"].sum())
        metrics.update({f"timing_s/{name}": value for name, value in timing.items()})
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        return self._publish(metrics)

    def _actor_mfu(self, *args: Any, **kwargs: Any) -> None:  # the PPO MFU counts rollout tokens
        return None
