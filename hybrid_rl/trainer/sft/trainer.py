"""Supervised fine-tuning, a mode on the trainer core: ``SFTTrainer`` (``main_sft``, :class:`SFTConfig`).

:class:`~hybrid_rl.trainer.core.loop.TrainerCore` gives it the loop, checkpoints, resume, trackers, the
progress bar, the plot and the validate/save cadence; :class:`~hybrid_rl.trainer.core.policy_mode.PolicyModeTrainer`
the actor worker group, the held-out generations and the step's logging; the actor worker gives it packing,
micro-batching, FSDP2 and LoRA. What is its own:

* its config is :class:`~hybrid_rl.trainer.config.supervised.SFTConfig` (veRL's SFT keys); the actor
  worker's config is built from it (:func:`~hybrid_rl.trainer.config.supervised.sft_actor_config`);
* the training set is an :class:`~hybrid_rl.data.sft.SFTDataset` (conversations tokenised with a
  loss mask on the assistant turns) and each step is ``update_actor`` on one batch of it with the
  ``nll`` objective (the masked negative log-likelihood, metric ``sft/loss``, logged as veRL's
  ``train/loss``), so packing, micro-batching, FSDP2 and LoRA are the actor's own;
* ``validate`` reports ``val/sft_loss`` (the held-out token-mean NLL, from the actor's log-prob pass
  over ``data.val_files``) and, through the rollout engine, the trainer's usual generation metrics
  on the prompts of the same rows (``val-core/<data_source>/reward/mean@1``: what a rule scorer
  thinks of what the model now writes, e.g. its format-following rate).
"""

from __future__ import annotations

from typing import Any

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import to_typed_config
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.config.supervised import SFTConfig, sft_actor_config
from hybrid_rl.trainer.config.supervised_checks import supervised_plan, validate_sft_config
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.policy_mode import PolicyModeTrainer
from hybrid_rl.trainer.core.validation import dataset_batches
from hybrid_rl.trainer.sft.contracts import sft_batch_plan

__all__ = ["SFTTrainer"]


class SFTTrainer(PolicyModeTrainer):
    """The trainer core whose step is one supervised update of the actor (see the module docstring);
    the actor worker group, the held-out generations and the logging are
    :class:`~hybrid_rl.trainer.core.policy_mode.PolicyModeTrainer`'s.

    Args:
        config: an :class:`SFTConfig`, or a DictConfig composed over it (``main_sft``'s :func:`sft_config`).
        tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s.
        actor_worker_cls: the actor worker class to use instead of the default one.
    """

    # ------------------------------------------------------------------ config
    def _typed_config(self, config: Any) -> SFTConfig:
        return to_typed_config(config, SFTConfig)

    def check_config(self, training: bool) -> None:
        validate_sft_config(self.config, training=training)
        self.actor_config = sft_actor_config(self.config)  # the actor worker's config, built from SFT's keys

    def make_plan(self) -> RunPlan:
        return supervised_plan(self.config)

    # ------------------------------------------------------------------ data
    def _sft_dataset(self, files: list[str]):
        from hybrid_rl.data.sft import SFTDataset

        d = self.config.data
        return SFTDataset(files, self.tokenizer, prompt_key=d.prompt_key, response_key=d.response_key,
                          messages_key=d.multiturn.messages_key if d.multiturn.enable else None,
                          max_length=d.max_length, truncation=d.truncation, prompt_dict_keys=d.prompt_dict_keys,
                          response_dict_keys=d.response_dict_keys, bad_rows=d.bad_rows,
                          max_bad_fraction=d.max_bad_fraction)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """Train: SFT conversations. Val: the same files read twice, as SFT rows (the loss) and, when
        they carry prompts with a data source and ground truth (and are not multi-turn), as prompts
        (generation metrics)."""
        return self._read_datasets("sft", self._sft_dataset, train_dataset, val_dataset,
                                   prompts=not self.config.data.multiturn.enable,
                                   held_out_only="SFT validation reports the held-out loss only")

    # ------------------------------------------------------------------ steps
    def declare_batch_plan(self) -> BatchPlan:
        return sft_batch_plan()

    def step_plan(self) -> list[str]:
        return ["update_actor"] + self.cadence_steps()

    def held_out_metrics(self) -> dict[str, float]:
        """``val/sft_loss``: the held-out token-mean NLL of the assistant tokens."""
        if self.held_out_dataset is None:
            return {}
        total, tokens = 0.0, 0.0
        for batch in dataset_batches(self.held_out_dataset, self.config.data.val_batch_size):
            log_probs = self.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]  # [B, R]
            mask = batch.batch["response_mask"].to(log_probs.dtype)
            total += float(-(log_probs * mask).sum())
            tokens += float(mask.sum())
        return {"val/sft_loss": total / max(tokens, 1.0)}

    def _train_metrics(self, batch: DataProto, metrics: dict[str, Any]) -> dict[str, float]:
        """``train/loss`` (veRL's SFT name) and the batch's target tokens."""
        return {"train/loss": metrics.get("sft/loss", float("nan")),
                "train/target_tokens": float(batch.batch["response_mask"].sum())}
