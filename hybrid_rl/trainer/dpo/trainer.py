"""Offline DPO, a mode on the trainer core: ``DPOTrainer`` (``main_dpo``, :class:`DPOConfig`).

:class:`~hybrid_rl.trainer.core.loop.TrainerCore` gives it the loop, checkpoints, resume, trackers, the
progress bar, the plot and the validate/save cadence; the actor worker gives it the reference
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

import logging
import os
from typing import Any, Optional

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import to_typed_config
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core import inputs, metrics as metric_fns, model_facts, worker_groups
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.checkpoints import estimate_checkpoint_bytes
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.core.generation import generation_meta
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.validation import dataset_batches, run_validation
from hybrid_rl.trainer.dpo.checks import dpo_plan, validate_dpo_config
from hybrid_rl.trainer.dpo.config import DPOConfig, dpo_actor_config, dpo_objective
from hybrid_rl.trainer.dpo.contracts import dpo_batch_plan
from hybrid_rl.trainer.dpo.validation import held_out_pair_metrics

__all__ = ["DPOTrainer"]

logger = logging.getLogger(__name__)


def _absorb(batch: DataProto, output: DataProto, metrics: dict[str, Any]) -> DataProto:
    """Copy a worker output's tensors into ``batch`` and its reduced worker metrics into ``metrics``."""
    for key in output.batch.keys() if output.batch is not None else []:
        batch.batch[key] = output.batch[key]
    metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
    return batch


class DPOTrainer(TrainerCore):
    """The trainer core whose step is one DPO update of the actor (see the module docstring).

    Args:
        config: a :class:`DPOConfig`, or a DictConfig composed over it (``main_dpo``'s :func:`dpo_config`).
        tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s
            (``val_dataset``: the held-out prompts to generate for).
        actor_worker_cls: the actor worker class to use instead of the default one.
    """

    def __init__(self, config, tokenizer=None, *, train_dataset=None, val_dataset=None,
                 actor_worker_cls: Optional[type] = None):
        super().__init__(config, tokenizer, train_dataset=train_dataset, val_dataset=val_dataset,
                         worker_classes=(actor_worker_cls,))
        cfg = self.config
        self.val_reward_fn = (inputs.make_reward_manager("naive", self.tokenizer, 0, cfg.custom_reward_function,
                                                         reward_fn_key=cfg.data.reward_fn_key,
                                                         single_process=cfg.trainer.single_process)
                              if self.val_dataset is not None else None)

    # ------------------------------------------------------------------ config
    def _typed_config(self, config: Any) -> DPOConfig:
        return to_typed_config(config, DPOConfig)

    def check_config(self, training: bool) -> None:
        validate_dpo_config(self.config, training=training)
        self.objective = dpo_objective(self.config)  # the driver's copy: the contract and held-out metrics
        self.actor_config = dpo_actor_config(self.config)  # the actor worker's config, built from DPO's keys

    def make_plan(self) -> RunPlan:
        return dpo_plan(self.config)

    def _build_tokenizer(self) -> Any:
        return inputs.supervised_tokenizer(self.config.model)

    def _report_precision(self) -> str:
        return model_facts.report_precision(self.config, self.plan, {
            "model.fsdp_config.mixed_precision.param_dtype": self.config.model.fsdp_config.mixed_precision.param_dtype,
            "rollout.dtype": self.config.rollout.dtype})

    def _memory_hint(self) -> str:
        d = self.config.data
        budget = (f"data.max_token_len_per_gpu (now {d.max_token_len_per_gpu})" if d.use_dynamic_bsz
                  else f"data.micro_batch_size_per_gpu (now {d.micro_batch_size_per_gpu} pairs)")
        return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower {budget} or "
                "data.max_length, set model.enable_gradient_checkpointing=true, or train LoRA adapters "
                "(model.lora_rank=32: the reference is then the base, no copy); each run logs "
                "perf/peak_rss_gib/<step>.")

    @property
    def actor_rollout_wg(self):
        return self.workers.actor_rollout

    def init_workers(self) -> None:
        """Start the actor worker group: actor, reference (unless the loss reads none) and the
        rollout engine for held-out generations."""
        cfg = self.config
        rows = worker_groups.rollout_rows_per_call(cfg, self.plan, self.val_dataset, rollout=self.actor_config.rollout)
        self.workers = worker_groups.build_worker_groups(
            cfg, self.plan, self.total_training_steps, actor_cls=self._worker_classes[0],
            call_timeout_s=cfg.trainer.worker_call_timeout_s, log_dir=os.path.join(self.run_dir, "logs"),
            rollout_rows_per_call=rows, actor_config=self.actor_config)

    def _checkpoint_bytes(self) -> int:
        contents = [list(self.actor_config.actor.checkpoint.save_contents)]
        return estimate_checkpoint_bytes(model_facts.count_model_params(self.actor_config.model), contents)

    def _checkpoint_parts(self) -> list[tuple[str, Any]]:
        return [("actor", self.actor_rollout_wg)]

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
        d = self.config.data
        train_files, val_files = supervised_data_files(d, "pairs")
        self.pair_val_dataset = self._pairs(val_files) if val_files else None
        if train_dataset is None:
            train_dataset = self._pairs(train_files)
        if val_dataset is None and val_files:
            try:
                val_dataset = inputs.build_prompt_dataset(val_files, self.tokenizer, prompt_key=d.prompt_key,
                                                          max_prompt_length=d.max_prompt_length)
            except ValueError as error:  # no data_source / ground truth: the pair metrics only
                logger.info("DPO validation reports the held-out pair metrics only (%s)",
                            str(error).splitlines()[0])
        return train_dataset, val_dataset

    # ------------------------------------------------------------------ steps
    def declare_batch_plan(self) -> BatchPlan:
        return dpo_batch_plan(self.objective, self.plan.use_reference_policy)

    def step_plan(self) -> list[str]:
        reference = ["compute_ref_log_prob"] if self.plan.use_reference_policy else []
        return reference + ["update_actor"] + self.cadence_steps()

    def compute_ref_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``ref_log_prob`` [2B, R]: both responses of every pair under the frozen reference."""
        return _absorb(batch, self.actor_rollout_wg.compute_ref_log_prob(batch), metrics)

    def update_actor(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """One optimizer step of the DPO loss on this batch of pairs."""
        return self._update(self.actor_rollout_wg.update_actor, batch, metrics)

    # ------------------------------------------------------------------ validation
    def _has_validation_data(self) -> bool:
        return self.val_dataset is not None or self.pair_val_dataset is not None

    def run_validation(self) -> dict[str, float]:
        metrics = self.pair_metrics()
        if self.val_dataset is not None:
            metrics.update(self.generation_metrics())
        return metrics

    def pair_metrics(self) -> dict[str, float]:
        """``val/dpo/*``: the DPO loss and TRL's reward statistics on the held-out pairs."""
        if self.pair_val_dataset is None:
            return {}
        wg = self.actor_rollout_wg
        reference = ((lambda batch: wg.compute_ref_log_prob(batch).batch["ref_log_prob"])
                     if self.plan.use_reference_policy else None)
        return held_out_pair_metrics(self.objective,
                                     dataset_batches(self.pair_val_dataset, self.config.data.val_batch_size),
                                     lambda batch: wg.compute_log_prob(batch).batch["old_log_probs"], reference)

    def generation_metrics(self) -> dict[str, float]:
        """What a rule scorer thinks of the model's greedy answers to the held-out prompts."""
        cfg = self.config
        batches = dataset_batches(self.val_dataset, cfg.data.val_batch_size)

        def generate(gen: DataProto) -> DataProto:
            gen.meta_info.update(generation_meta(self.tokenizer, cfg.trainer.seed, self.global_steps, validate=True))
            return self.actor_rollout_wg.generate_sequences(gen)

        return run_validation(batches, generate, self.val_reward_fn, self.tokenizer,
                              n=cfg.rollout.val_kwargs.n, step=self.global_steps,
                              num_logged=cfg.trainer.log_val_generations, run_dir=self.run_dir)

    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """``train/loss`` (veRL's name of the DPO loss), pairs, timings; then the trackers."""
        metrics["train/loss"] = metrics.get("dpo/loss", float("nan"))
        metrics["train/pairs"] = float(len(batch) // 2)
        metrics.update({f"timing_s/{name}": value for name, value in timing.items()})
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        return self._publish(metrics)
