"""Supervised fine-tuning, a mode on the trainer core: ``SFTTrainer`` (``main_sft``, :class:`SFTConfig`).

:class:`~hybrid_rl.trainer.core.loop.TrainerCore` gives it the loop, checkpoints, resume, trackers, the
progress bar, the plot and the validate/save cadence; the actor worker gives it packing,
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

import logging
import os
from typing import Any, Optional

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config.loader import to_typed_config
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.config.supervised import SFTConfig, sft_actor_config
from hybrid_rl.trainer.config.supervised_checks import supervised_plan, validate_sft_config
from hybrid_rl.trainer.core import inputs, metrics as metric_fns, model_facts, worker_groups
from hybrid_rl.trainer.core.checkpoints import estimate_checkpoint_bytes
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.core.generation import generation_meta
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.validation import dataset_batches, run_validation
from hybrid_rl.trainer.sft.contracts import sft_batch_plan

__all__ = ["SFTTrainer"]

logger = logging.getLogger(__name__)


class SFTTrainer(TrainerCore):
    """The trainer core whose step is one supervised update of the actor (see the module docstring).

    Args:
        config: an :class:`SFTConfig`, or a DictConfig composed over it (``main_sft``'s :func:`sft_config`).
        tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s.
        actor_worker_cls: the actor worker class to use instead of the default one.
    """

    def __init__(self, config, tokenizer=None, *, train_dataset=None, val_dataset=None,
                 actor_worker_cls: Optional[type] = None):
        super().__init__(config, tokenizer, train_dataset=train_dataset, val_dataset=val_dataset,
                         worker_classes=(actor_worker_cls, None))
        cfg = self.config
        # held-out generations are scored like the RL trainer's validation (no samples logged per step)
        self.val_reward_fn = (inputs.make_reward_manager("naive", self.tokenizer, 0, cfg.custom_reward_function,
                                                         reward_fn_key=cfg.data.reward_fn_key,
                                                         single_process=cfg.trainer.single_process)
                              if self.val_dataset is not None else None)

    # ------------------------------------------------------------------ config
    def _typed_config(self, config: Any) -> SFTConfig:
        return to_typed_config(config, SFTConfig)

    def check_config(self, training: bool) -> None:
        validate_sft_config(self.config, training=training)
        self.actor_config = sft_actor_config(self.config)  # the actor worker's config, built from SFT's keys

    def make_plan(self) -> RunPlan:
        return supervised_plan(self.config)

    def _build_tokenizer(self) -> Any:
        return inputs.supervised_tokenizer(self.config.model)

    def _report_precision(self) -> str:
        return model_facts.report_precision(self.config, self.plan, {
            "model.fsdp_config.mixed_precision.param_dtype": self.config.model.fsdp_config.mixed_precision.param_dtype,
            "rollout.dtype": self.config.rollout.dtype})

    def _memory_hint(self) -> str:
        d = self.config.data
        budget = (f"data.max_token_len_per_gpu (now {d.max_token_len_per_gpu})" if d.use_dynamic_bsz
                  else f"data.micro_batch_size_per_gpu (now {d.micro_batch_size_per_gpu})")
        return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower {budget} or "
                "data.max_length, set model.enable_gradient_checkpointing=true, or train LoRA adapters "
                "(model.lora_rank=32); each run logs perf/peak_rss_gib/<step>.")

    @property
    def actor_rollout_wg(self):
        return self.workers.actor_rollout

    def init_workers(self) -> None:
        """Start the actor worker group (actor and the rollout engine for held-out generations)."""
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
        they carry prompts with a data source and ground truth, as prompts (generation metrics)."""
        d = self.config.data
        train_files, val_files = supervised_data_files(d, "sft")
        self.sft_val_dataset = self._sft_dataset(val_files) if val_files else None
        if train_dataset is None:
            train_dataset = self._sft_dataset(train_files)
        if val_dataset is None and val_files and not d.multiturn.enable:
            try:
                val_dataset = inputs.build_prompt_dataset(val_files, self.tokenizer, prompt_key=d.prompt_key,
                                                          max_prompt_length=d.max_prompt_length)
            except ValueError as error:  # no data_source / ground truth: the loss only
                logger.info("SFT validation reports the held-out loss only (%s)", str(error).splitlines()[0])
        return train_dataset, val_dataset

    def declare_batch_plan(self) -> BatchPlan:
        return sft_batch_plan()

    def step_plan(self) -> list[str]:
        return ["update_actor"] + self.cadence_steps()

    def update_actor(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """One optimizer step of the supervised loss on this batch of conversations."""
        return self._update(self.actor_rollout_wg.update_actor, batch, metrics)

    def _has_validation_data(self) -> bool:
        return self.val_dataset is not None or self.sft_val_dataset is not None

    def run_validation(self) -> dict[str, float]:
        metrics = self.validation_loss()
        if self.val_dataset is not None:
            metrics.update(self.generation_metrics())
        return metrics

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

    def validation_loss(self) -> dict[str, float]:
        """``val/sft_loss``: the held-out token-mean NLL of the assistant tokens."""
        if self.sft_val_dataset is None:
            return {}
        total, tokens = 0.0, 0.0
        for batch in dataset_batches(self.sft_val_dataset, self.config.data.val_batch_size):
            log_probs = self.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]  # [B, R]
            mask = batch.batch["response_mask"].to(log_probs.dtype)
            total += float(-(log_probs * mask).sum())
            tokens += float(mask.sum())
        return {"val/sft_loss": total / max(tokens, 1.0)}

    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """``train/loss`` (veRL's SFT name), tokens and timings; then the trackers."""
        metrics["train/loss"] = metrics.get("sft/loss", float("nan"))
        metrics["train/target_tokens"] = float(batch.batch["response_mask"].sum())
        metrics.update({f"timing_s/{name}": value for name, value in timing.items()})
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        return self._publish(metrics)
