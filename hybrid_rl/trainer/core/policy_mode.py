"""A mode that trains the policy model with the actor worker and answers held-out prompts with its rollout engine.

:class:`PolicyModeTrainer` is the part of :class:`~hybrid_rl.trainer.core.loop.TrainerCore` that the
actor-only modes (SFT, offline DPO) share: the tokenizer and compute dtype of ``model.*``, the one
actor worker group (its actor, the reference when the plan uses one, its rollout engine), the actor-only
checkpoint, the held-out files read twice (by the mode's dataset and as prompts), the generation
metrics of those prompts and the step's timings. What stays the mode's: its config and checks, its
training set, its step plan and batch contract, its held-out metrics (:meth:`held_out_metrics`) and the
``train/*`` names of its loss (:meth:`_train_metrics`). It is no mode itself: the modes stay siblings.
"""

from __future__ import annotations

import abc
import logging
import os
from typing import Any, Callable, Optional

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import inputs, metrics as metric_fns, model_facts, worker_groups
from hybrid_rl.trainer.core.checkpoints import estimate_checkpoint_bytes
from hybrid_rl.trainer.core.default_task import supervised_data_files
from hybrid_rl.trainer.core.generation import generation_meta
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.validation import dataset_batches, run_validation

__all__ = ["PolicyModeTrainer"]

logger = logging.getLogger(__name__)


class PolicyModeTrainer(TrainerCore):
    """The trainer core of a mode whose step updates the actor on a supervised batch (see the module docstring).

    A subclass sets ``self.actor_config`` (the actor worker's config) in ``check_config`` and builds its
    datasets with :meth:`_read_datasets`.

    Args:
        config, tokenizer, train_dataset, val_dataset: as :class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s
            (``val_dataset``: the held-out prompts to generate for).
        actor_worker_cls: the actor worker class to use instead of the default one.
    """

    #: what ``data.micro_batch_size_per_gpu`` counts, as the memory hint says it (e.g. ``" pairs"``)
    micro_batch_unit: str = ""
    #: what LoRA adapters spare besides the optimizer state, as the memory hint says it
    lora_note: str = ""

    def __init__(self, config, tokenizer=None, *, train_dataset=None, val_dataset=None,
                 actor_worker_cls: Optional[type] = None):
        super().__init__(config, tokenizer, train_dataset=train_dataset, val_dataset=val_dataset,
                         worker_classes=(actor_worker_cls,))
        cfg = self.config
        # held-out generations are scored like the RL trainer's validation (no samples logged per step)
        self.val_reward_fn = (inputs.make_reward_manager("naive", self.tokenizer, 0, cfg.custom_reward_function,
                                                         reward_fn_key=cfg.data.reward_fn_key,
                                                         single_process=cfg.trainer.single_process)
                              if self.val_dataset is not None else None)

    # ------------------------------------------------------------------ model and workers
    def _build_tokenizer(self) -> Any:
        return inputs.supervised_tokenizer(self.config.model)

    def _report_precision(self) -> str:
        return model_facts.report_precision(self.config, self.plan, {
            "model.fsdp_config.mixed_precision.param_dtype": self.config.model.fsdp_config.mixed_precision.param_dtype,
            "rollout.dtype": self.config.rollout.dtype})

    def _memory_hint(self) -> str:
        d = self.config.data
        budget = (f"data.max_token_len_per_gpu (now {d.max_token_len_per_gpu})" if d.use_dynamic_bsz
                  else f"data.micro_batch_size_per_gpu (now {d.micro_batch_size_per_gpu}{self.micro_batch_unit})")
        return (f"\nIf it ran out of memory (killed without a traceback), see docs/memory.md: lower {budget} or "
                "data.max_length, set model.enable_gradient_checkpointing=true, or train LoRA adapters "
                f"(model.lora_rank=32{self.lora_note}); each run logs perf/peak_rss_gib/<step>.")

    @property
    def actor_rollout_wg(self):
        return self.workers.actor_rollout

    def init_workers(self) -> None:
        """Start the actor worker group: the actor, the reference when the plan uses one, and the
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
    def _read_datasets(self, kind: str, build: Callable[[list[str]], Any], train_dataset: Any, val_dataset: Any,
                       *, prompts: bool, held_out_only: str) -> tuple[Any, Any]:
        """Train: ``build(train files)``. Val: the held-out files read twice, by ``build``
        (``self.held_out_dataset``, the mode's held-out metrics) and, with ``prompts`` and when they
        carry prompts with a data source and ground truth, as prompts (generations); else
        ``held_out_only`` is logged with the reason.

        Args:
            kind: the default task's files to use without ``data.train_files`` (``"sft"``, ``"pairs"``).
        """
        d = self.config.data
        train_files, val_files = supervised_data_files(d, kind)
        self.held_out_dataset = build(val_files) if val_files else None
        if train_dataset is None:
            train_dataset = build(train_files)
        if val_dataset is None and val_files and prompts:
            try:
                val_dataset = inputs.build_prompt_dataset(val_files, self.tokenizer, prompt_key=d.prompt_key,
                                                          max_prompt_length=d.max_prompt_length)
            except ValueError as error:  # no data_source / ground truth: the mode's held-out metrics only
                logger.info("%s (%s)", held_out_only, str(error).splitlines()[0])
        return train_dataset, val_dataset

    # ------------------------------------------------------------------ steps
    def update_actor(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """One optimizer step of the mode's objective on this batch."""
        return self._update(self.actor_rollout_wg.update_actor, batch, metrics)

    # ------------------------------------------------------------------ validation
    def _has_validation_data(self) -> bool:
        return self.val_dataset is not None or self.held_out_dataset is not None

    def run_validation(self) -> dict[str, float]:
        metrics = self.held_out_metrics()
        if self.val_dataset is not None:
            metrics.update(self.generation_metrics())
        return metrics

    @abc.abstractmethod
    def held_out_metrics(self) -> dict[str, float]:
        """The mode's metrics of ``self.held_out_dataset`` (``{}`` without one)."""

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

    # ------------------------------------------------------------------ logging
    @abc.abstractmethod
    def _train_metrics(self, batch: DataProto, metrics: dict[str, Any]) -> dict[str, float]:
        """The ``train/*`` metrics of this step: veRL's ``train/loss`` from the objective's metric and
        what the batch held."""

    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """The mode's ``train/*`` metrics, timings and throughput; then the trackers."""
        metrics.update(self._train_metrics(batch, metrics))
        metrics.update({f"timing_s/{name}": value for name, value in timing.items()})
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        return self._publish(metrics)
