"""Offline DPO, a mode on the trainer core: ``DPOTrainer`` (``main_dpo``, :class:`DPOConfig`).

:class:`~hybrid_rl.trainer.core.loop.TrainerCore` gives it the loop, checkpoints, resume, trackers, the
progress bar, the plot and the validate/save cadence; :class:`~hybrid_rl.trainer.core.policy_mode.PolicyModeTrainer`
the actor worker group, the held-out generations and the step's logging; the actor worker gives it the reference
policy, packing, micro-batching (a pair's two rows always together), FSDP2 and LoRA. What is its own:

* its config is :class:`~hybrid_rl.trainer.dpo.config.DPOConfig` (veRL's SFT keys, the pairs'
  columns, TRL's DPO names in ``dpo.*``); the actor worker's config is built from it
  (:func:`~hybrid_rl.trainer.dpo.config.dpo_actor_config`);
* the training set is a :class:`~hybrid_rl.data.dpo_data.DPODataset` (the reward model's loaders and
  ``data.bad_rows``; 2 rows a pair) and each step is ``compute_ref_log_prob`` (skipped when the loss
  reads no reference: ``simpo``, ``dpo.reference_free``) then ``update_actor`` with the ``dpo``
  objective: its metrics are ``dpo/`` + TRL's names (``dpo/rewards/chosen``, ``dpo/rewards/rejected``,
  ``dpo/rewards/accuracies``, ``dpo/rewards/margins``, ``dpo/logps/chosen``, ``dpo/logps/rejected``)
  and ``dpo/loss``, logged also as veRL's ``train/loss``;
* ``validate`` reports the same metrics on the held-out pairs (``val/dpo/...``, :mod:`.validation`)
  and, through the rollout engine, the trainer's generation metrics on their prompts
  (``val-core/<data_source>/reward/mean@1``: the rule scorer's accuracy of the greedy answers);
* checkpoints hold the actor only (``global_step_N/actor``): the reference is the starting model.
"""

from __future__ import annotations

from typing import Any

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import to_typed_config
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.policy_mode import PolicyModeTrainer
from hybrid_rl.trainer.core.validation import dataset_batches
from hybrid_rl.trainer.dpo.checks import dpo_plan, validate_dpo_config
from hybrid_rl.trainer.dpo.config import DPOConfig, dpo_actor_config, dpo_objective
from hybrid_rl.trainer.dpo.contracts import dpo_batch_plan
from hybrid_rl.trainer.dpo.validation import held_out_pair_metrics

__all__ = ["DPOTrainer"]


class DPOTrainer(PolicyModeTrainer):
    """The trainer core whose step is one DPO update of the actor (see the module docstring); the
    actor worker group, the held-out generations and the logging are
    :class:`~hybrid_rl.trainer.core.policy_mode.PolicyModeTrainer`'s.

    Args:
        config: a :class:`DPOConfig`, or a DictConfig composed over it (``main_dpo``'s :func:`dpo_config`).
        tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s
            (``val_dataset``: the held-out prompts to generate for).
        actor_worker_cls: the actor worker class to use instead of the default one.
    """

    micro_batch_unit = " pairs"
    lora_note = ": the reference is then the base, no copy"

    # ------------------------------------------------------------------ config
    def _typed_config(self, config: Any) -> DPOConfig:
        return to_typed_config(config, DPOConfig)

    def check_config(self, training: bool) -> None:
        validate_dpo_config(self.config, training=training)
        self.objective = dpo_objective(self.config)  # the driver's copy: the contract and held-out metrics
        self.actor_config = dpo_actor_config(self.config)  # the actor worker's config, built from DPO's keys

    def make_plan(self) -> RunPlan:
        return dpo_plan(self.config)

    # ------------------------------------------------------------------ data
    def _pairs(self, files: list[str]):
        from hybrid_rl.data.dpo_data import DPODataset

        d = self.config.data
        return DPODataset(files, self.tokenizer, prompt_key=d.prompt_key, chosen_key=d.chosen_key,
                          rejected_key=d.rejected_key, max_prompt_length=d.max_prompt_length,
                          max_length=d.max_length, truncation=d.truncation, bad_rows=d.bad_rows,
                          max_bad_fraction=d.max_bad_fraction)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """Train: preference pairs. Val: the held-out files read twice, as pairs (the DPO metrics)
        and, when they carry prompts with a data source and ground truth, as prompts (generations)."""
        return self._read_datasets("pairs", self._pairs, train_dataset, val_dataset, prompts=True,
                                   held_out_only="DPO validation reports the held-out pair metrics only")

    # ------------------------------------------------------------------ steps
    def declare_batch_plan(self) -> BatchPlan:
        return dpo_batch_plan(self.objective, self.plan.use_reference_policy)

    def step_plan(self) -> list[str]:
        reference = ["compute_ref_log_prob"] if self.plan.use_reference_policy else []
        return reference + ["update_actor"] + self.cadence_steps()

    def compute_ref_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``ref_log_prob`` [2B, R]: both responses of every pair under the frozen reference."""
        return self._absorb(batch, self.actor_rollout_wg.compute_ref_log_prob(batch), metrics)

    def held_out_metrics(self) -> dict[str, float]:
        """``val/dpo/*``: the DPO loss and TRL's reward statistics on the held-out pairs."""
        if self.held_out_dataset is None:
            return {}
        wg = self.actor_rollout_wg
        reference = ((lambda batch: wg.compute_ref_log_prob(batch).batch["ref_log_prob"])
                     if self.plan.use_reference_policy else None)
        return held_out_pair_metrics(self.objective,
                                     dataset_batches(self.held_out_dataset, self.config.data.val_batch_size),
                                     lambda batch: wg.compute_log_prob(batch).batch["old_log_probs"], reference)

    def _train_metrics(self, batch: DataProto, metrics: dict[str, Any]) -> dict[str, float]:
        """``train/loss`` (veRL's name of the DPO loss) and the batch's pairs."""
        return {"train/loss": metrics.get("dpo/loss", float("nan")), "train/pairs": float(len(batch) // 2)}
