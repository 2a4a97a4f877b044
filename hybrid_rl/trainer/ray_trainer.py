"""RayPPOTrainer: the driver loop of PPO-family training (PPO/GAE, GRPO, RLOO, REINFORCE++, ReMax).

One training step is a list of named steps, each a method ``step(batch, metrics) -> batch`` timed
into ``timing_s/<step>``::

    generate -> compute_reward -> compute_old_log_prob -> [compute_ref_log_prob] -> [compute_values]
    -> compute_advantage -> [update_critic] -> update_actor -> [validate] -> [save_checkpoint] -> log

:meth:`RayPPOTrainer.step_plan` decides which steps run this step; a variant trainer overrides it
(to insert or drop a step) or a single step method — it never copies :meth:`fit`. Only light math
runs here; model work runs in the colocated Ray worker group (one process per device).
"""

from __future__ import annotations

import logging
import os
import random
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Iterator, Optional

import numpy as np
import torch
from codetiming import Timer

from hybrid_rl.algorithms import get_kl_controller, masked_mean
from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import WorkerDiedError, WorkerGroupError
from hybrid_rl.trainer import components, metrics as metric_fns, ppo_ops, reward_model
from hybrid_rl.trainer.checkpoint_manager import (CheckpointManager, capture_rng_state, estimate_checkpoint_bytes,
                                                   restore_rng_state)
from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config_loader import to_container, to_ppo_config
from hybrid_rl.trainer.health import HealthMonitor, memory_hint
from hybrid_rl.trainer.plotting import PLOT_FILE, plot_run
from hybrid_rl.trainer.tracking import ProgressBar, Tracking, as_backend_list
from hybrid_rl.trainer.validate import make_run_plan, resume_point_problems, run_dir, validate_config
from hybrid_rl.trainer.validation import run_validation
from hybrid_rl.workers.config import update_is_on_policy
from hybrid_rl.utils import faults

logger = logging.getLogger(__name__)

# veRL's names for the same timings, so veRL dashboards and the benchmarks read them unchanged.
VERL_TIMING_ALIASES = {
    "generate": "gen",
    "compute_reward": "reward",
    "compute_old_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref",
    "compute_values": "values",
    "compute_advantage": "adv",
    "validate": "testing",
}


@contextmanager
def _timed(name: str, timing: dict[str, float]) -> Iterator[None]:
    with Timer(name=None, text="", logger=None) as timer:
        yield
    timing[name] = timing.get(name, 0.0) + timer.last


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _absorb(batch: DataProto, output: DataProto, metrics: dict[str, Any]) -> DataProto:
    """Copy a worker output's tensors into ``batch`` and its reduced worker metrics into ``metrics``."""
    for key in output.batch.keys() if output.batch is not None else []:
        batch.batch[key] = output.batch[key]
    metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
    return batch


VAL_ROWS_IN_FLIGHT = 64
"""Validation rows the engine's KV cache is sized to hold at once (per val_kwargs.n sample): on 2
CPU cores greedy validation of 200 rows took as long with 64 in flight (7.4-7.6 s) as with all 200
(7.4-7.9 s), and the cache for 200 rows held 0.8 GiB (docs/memory.md)."""


class RayPPOTrainer:
    """Drives colocated actor/rollout/ref (+ critic) workers through PPO-style training.

    Args:
        config: a DictConfig from :func:`hybrid_rl.trainer.get_config` or a :class:`PPOConfig`.
        tokenizer: defaults to the actor model's tokenizer.
        reward_fn / val_reward_fn: reward managers (``manager(batch, return_dict=True)``); default:
            ``reward_model.reward_manager`` around the custom or built-in scorer, run on the driver.
        train_dataset / val_dataset: prompt datasets; default: built from ``data.*``.
        actor_worker_cls / critic_worker_cls: worker classes to use instead of the default ones.
    """

    def __init__(self, config, tokenizer=None, *, reward_fn=None, val_reward_fn=None, train_dataset=None,
                 val_dataset=None, actor_worker_cls: Optional[type] = None, critic_worker_cls: Optional[type] = None):
        self.config: PPOConfig = to_ppo_config(config)
        validate_config(self.config)
        cfg = self.config
        self.plan = make_run_plan(cfg)
        self.actor_compute_dtype = self._report_precision()
        self.tokenizer = tokenizer if tokenizer is not None else components.build_tokenizer(cfg)
        self.reward_fn = reward_fn or components.build_reward_manager(cfg, self.tokenizer, cfg.reward_model.num_examine)
        self.val_reward_fn = val_reward_fn or components.build_reward_manager(cfg, self.tokenizer, num_examine=0)
        self.remote_rm = components.build_remote_reward_model(cfg)  # None unless reward_model.model.path is a URL
        self.train_dataset, self.val_dataset = self._datasets(train_dataset, val_dataset)
        self.train_dataloader = components.build_train_dataloader(self.train_dataset, cfg)
        self.total_training_steps = self._count_training_steps()
        self.kl_ctrl_in_reward = get_kl_controller(**asdict(cfg.algorithm.kl_ctrl)) if cfg.algorithm.use_kl_in_reward else None
        self.run_dir = run_dir(cfg)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.trainer.max_actor_ckpt_to_keep)
        if cfg.trainer.save_freq > 0:
            self.checkpoints.probe(self._checkpoint_bytes())
        self.health = HealthMonitor.from_config(cfg.trainer)
        self.last_committed_step: Optional[int] = None  # newest checkpoint this trainer committed
        self.global_steps = 0
        self.resumed_state: Optional[dict[str, Any]] = None  # the driver state a resume restored
        self.workers: Optional[components.WorkerGroups] = None
        self.tracker: Optional[Tracking] = None
        self.progress: Optional[ProgressBar] = None
        self._worker_classes = (actor_worker_cls, critic_worker_cls)
        # ((body, head) params, peak FLOP/s per worker in the actor's compute dtype, or None)
        self._flops: Optional[tuple[tuple[int, int], Optional[float]]] = None

    # ------------------------------------------------------------------ set-up
    def _report_precision(self) -> str:
        """Log the compute dtypes of the models this run trains; returns the first one's (the actor's)."""
        return components.report_precision(self.config, self.plan)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """The given datasets, else the ones ``data.*`` describes (val: None when there is none)."""
        if train_dataset is not None and val_dataset is not None:
            return train_dataset, val_dataset
        train_files, val_files = components.resolve_data_files(self.config)
        if train_dataset is None:
            train_dataset = components.build_dataset(train_files, self.tokenizer, self.config)
        if val_dataset is None and val_files:
            val_dataset = components.build_dataset(val_files, self.tokenizer, self.config)
        return train_dataset, val_dataset

    def _checkpoint_bytes(self) -> int:
        """Estimated size of one checkpoint (actor, + critic for GAE), for the disk-space probe."""
        contents = [list(self.config.actor_rollout_ref.actor.checkpoint.save_contents)]
        if self.plan.use_critic:
            contents.append(list(self.config.critic.checkpoint.save_contents))
        return estimate_checkpoint_bytes(components.count_model_params(self.config), contents)

    def _count_training_steps(self) -> int:
        per_epoch = len(self.train_dataloader)
        by_epochs = per_epoch * self.config.trainer.total_epochs
        requested = self.config.trainer.total_training_steps
        return min(requested, by_epochs) if requested is not None else by_epochs

    @property
    def actor_rollout_wg(self):
        return self.workers.actor_rollout

    @property
    def critic_wg(self):
        return self.workers.critic

    @property
    def rollout_wg(self):
        """The group that generates: the colocated one, or the decoupled mode's rollout pool."""
        return self.workers.rollout if self.workers.rollout is not None else self.workers.actor_rollout

    def init_workers(self) -> None:
        """Start the colocated worker group and load the models."""
        actor_cls, critic_cls = self._worker_classes
        self.workers = components.build_worker_groups(
            self.config, self.plan, self.total_training_steps, actor_cls=actor_cls, critic_cls=critic_cls,
            call_timeout_s=self.config.trainer.worker_call_timeout_s, log_dir=os.path.join(self.run_dir, "logs"),
            rollout_rows_per_call=self._rollout_rows_per_call(),
        )

    def _rollout_rows_per_call(self) -> int:
        """Rows the rollout engine should hold at once per worker (it sizes vLLM-CPU's KV cache): a
        training batch (x n), or a validation batch (x val_kwargs.n) up to VAL_ROWS_IN_FLIGHT; larger
        validation batches queue in the engine. Split over the workers."""
        cfg = self.config
        rollout = cfg.actor_rollout_ref.rollout
        rows = cfg.data.train_batch_size * rollout.n
        t = cfg.trainer
        if self.val_dataset is not None and (t.test_freq > 0 or t.val_before_train or t.val_at_end):
            val_batch = cfg.data.val_batch_size or len(self.val_dataset)
            rows = max(rows, min(val_batch, len(self.val_dataset), VAL_ROWS_IN_FLIGHT) * rollout.val_kwargs.n)
        return -(-rows // (self.plan.rollout_world_size or self.plan.world_size))

    def shutdown(self) -> None:
        """Stop the workers and release their devices."""
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        if self.workers is None:
            self.init_workers()
        last: dict[str, float] = self._begin_fit()
        try:
            for batch in self._batches():
                self.global_steps += 1
                last = self.train_step(batch)
                self.health.observe(last, self.global_steps)
                self.on_step_end(last)
        finally:
            self._end_fit()
        return last

    def _batches(self) -> Iterator[DataProto]:
        """Prompt batches until the last step, cycling epochs (the loader resumes mid-epoch)."""
        while self.global_steps < self.total_training_steps:
            batches = iter(self.train_dataloader)
            while True:
                # torch's DataLoader draws a base seed from the global RNG when an epoch starts; a
                # resumed run starts its epoch at another point, so keep the loader off that RNG.
                with torch.random.fork_rng(devices=[]):
                    batch_dict = next(batches, None)
                if batch_dict is None:
                    break
                yield DataProto.from_single_dict(batch_dict)
                if self.global_steps >= self.total_training_steps:
                    return

    def step_plan(self) -> list[str]:
        """Names of the step methods run at ``self.global_steps``, in order (override to customise)."""
        cfg = self.config
        steps = ["generate"]
        if self.plan.use_greedy_baseline:
            steps.append("compute_reward_baseline")
        if cfg.reward_model.enable:
            steps.append("compute_rm_score")
        steps.append("compute_reward")
        # on-policy: the actor uses its own detached log-probs; the in-reward KL still needs them
        if not (update_is_on_policy(cfg.actor_rollout_ref.actor, cfg.data.train_batch_size)
                and not cfg.algorithm.use_kl_in_reward):
            steps.append("compute_old_log_prob")
        if self.plan.use_reference_policy:
            steps.append("compute_ref_log_prob")
        if self.plan.use_critic:
            steps.append("compute_values")
        steps.append("compute_advantage")
        if self.plan.use_critic:
            steps.append("update_critic")
        if self.global_steps > cfg.trainer.critic_warmup:
            steps.append("update_actor")
        if self._validation_due():
            steps.append("validate")
        if self._save_due():
            steps.append("save_checkpoint")
        return steps

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """Run :meth:`step_plan` on one prompt batch, then :meth:`log`; returns the step's metrics."""
        metrics: dict[str, Any] = {}
        timing: dict[str, float] = {}
        with _timed("step", timing):
            for name in self.step_plan():
                faults.inject(f"driver.{name}", self.global_steps)  # no-op unless HYBRID_RL_FAULT (tests)
                with _timed(name, timing):
                    batch = self._run_step(name, batch, metrics)
        return self.log(batch, metrics, timing)

    def _run_step(self, name: str, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        try:
            return getattr(self, name)(batch, metrics)
        except WorkerGroupError as error:
            # Which worker and call the group error names; which training step only the driver knows.
            hint = memory_hint(self.config) if isinstance(error, WorkerDiedError) else ""
            raise type(error)(f"training step {self.global_steps}, `{name}`: {error}{hint}") from error

    def on_step_end(self, metrics: dict[str, float]) -> None:
        """Hook called after each logged step and the built-in health checks (early stopping, ...);
        no-op here."""

    def _is_last_step(self) -> bool:
        return self.global_steps >= self.total_training_steps

    def _has_validation_data(self) -> bool:
        """Whether there is anything to validate on (a variant trainer may have more than prompts)."""
        return self.val_dataset is not None

    def _validation_due(self) -> bool:
        t = self.config.trainer
        if not self._has_validation_data():
            return False
        return (t.test_freq > 0 and self.global_steps % t.test_freq == 0) or (self._is_last_step() and t.val_at_end)

    def _save_due(self) -> bool:
        t = self.config.trainer
        return t.save_freq > 0 and (self.global_steps % t.save_freq == 0 or self._is_last_step())

    # ------------------------------------------------------------------ named steps
    def _generation_meta(self, validate: bool, step: Optional[int] = None) -> dict[str, Any]:
        """Sampling meta_info; ``step`` (default: the current step) seeds a training batch."""
        step = self.global_steps if step is None else step
        seed = self.config.trainer.seed + (0 if validate else step)
        return {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id,
                "validate": validate, "seed": seed, "global_steps": step}

    def generate(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Repeat each prompt ``rollout.n`` times (shared ``uid``) and sample one response per row."""
        return self.generate_batch(batch, self.global_steps, metrics)

    def generate_batch(self, batch: DataProto, step: int, metrics: dict[str, Any]) -> DataProto:
        """:meth:`generate` for prompt batch number ``step`` (its uids and seed) on :attr:`rollout_wg`."""
        batch = ppo_ops.prepare_rollout_batch(batch, self.config.actor_rollout_ref.rollout.n, step)
        gen, rest = ppo_ops.split_generation_inputs(batch)
        gen.meta_info.update(self._generation_meta(validate=False, step=step))
        output = self.rollout_wg.generate_sequences(gen)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return ppo_ops.merge_generation_output(rest, output)

    def compute_reward_baseline(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``reward_baselines`` (an estimator's ``needs_greedy_baseline``, e.g. ReMax): score one greedy
        response per prompt; its reward is the baseline of the group."""
        n = self.config.actor_rollout_ref.rollout.n
        first = batch.select_idxs(np.arange(0, len(batch), n))
        width = first.batch["prompts"].shape[-1]
        gen = DataProto.from_dict(
            tensors={"input_ids": first.batch["prompts"], "attention_mask": first.batch["attention_mask"][:, :width],
                     "position_ids": first.batch["position_ids"][:, :width]},
            non_tensors=dict(first.non_tensor_batch), meta_info=self._generation_meta(validate=False))
        gen.meta_info["do_sample"] = False
        greedy = ppo_ops.merge_generation_output(
            DataProto(non_tensor_batch=dict(first.non_tensor_batch)), self.actor_rollout_wg.generate_sequences(gen))
        baseline = self.reward_fn(greedy, return_dict=True)["reward_tensor"].sum(-1)  # [B / n]
        batch.batch["reward_baselines"] = baseline.repeat_interleave(n)  # [B]
        return batch

    def compute_rm_score(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Learned reward model: ``rm_scores`` [B, R] (normalised as trained) and ``rm_raw_scores`` [B]
        from the colocated reward-model workers, or from the remote service (docs/rlhf_pipeline.md)."""
        if self.remote_rm is not None:
            return _absorb(batch, reward_model.remote_scores(self.remote_rm, batch, self.tokenizer), metrics)
        return _absorb(batch, self.workers.reward_model.compute_rm_score(batch), metrics)

    def compute_reward(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``token_level_scores`` from the reward manager (on the driver; failure counts to metrics),
        combined with the learned reward model's ``rm_scores`` when there are any."""
        rm_scores, raw_rm = reward_model.pop_rm_scores(batch)
        rule = None
        if rm_scores is None or reward_model.rule_scores_wanted(self.config, self.reward_fn, batch):
            result = self.reward_fn(batch, return_dict=True)
            rule = result["reward_tensor"]
            metrics.update(result.get("reward_metrics", {}))
            for key, values in result.get("reward_extra_info", {}).items():
                column = np.empty(len(values), dtype=object)
                column[:] = list(values)
                batch.non_tensor_batch[f"reward_extra_{key}"] = column
        batch.batch["token_level_scores"] = rule if rm_scores is None else reward_model.rewards_with_rm(
            self.config.reward_model, rm_scores, rule, raw_rm, metrics)
        return batch

    def compute_old_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``old_log_probs`` of the sampled tokens under the current actor (+ mean entropy metric)."""
        output = self.actor_rollout_wg.compute_log_prob(batch)
        if "entropys" in output.batch.keys():
            entropys = output.batch.pop("entropys")
            metrics["actor/entropy"] = float(masked_mean(entropys, batch.batch["response_mask"].float()))
        return _absorb(batch, output, metrics)

    def compute_ref_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy."""
        return _absorb(batch, self.actor_rollout_wg.compute_ref_log_prob(batch), metrics)

    def compute_values(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Critic ``values`` per response token."""
        return _absorb(batch, self.critic_wg.compute_values(batch), metrics)

    def compute_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Rewards (minus the in-reward KL if enabled), then the registered advantage estimator."""
        alg = self.config.algorithm
        if self.kl_ctrl_in_reward is not None:
            batch, kl_metrics = ppo_ops.apply_kl_penalty(batch, self.kl_ctrl_in_reward, alg.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return ppo_ops.compute_advantage(batch, alg.adv_estimator, gamma=alg.gamma, lam=alg.lam,
                                         norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)

    def update_critic(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        output = self.critic_wg.update_critic(batch)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return batch

    def update_actor(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        batch.meta_info["global_steps"] = self.global_steps
        output = self.actor_rollout_wg.update_actor(batch)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return batch

    def validate(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        metrics.update(self.run_validation())
        return batch

    def save_checkpoint(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Workers write actor/critic, then the driver state marks the step complete (atomically)."""
        step = self.global_steps
        try:
            self.checkpoints.begin(step)
            for name, group in self._checkpoint_parts():
                group.save_checkpoint(os.path.join(self.checkpoints.step_dir(step), name), global_step=step)
            faults.inject("driver.commit", step)  # no-op unless HYBRID_RL_FAULT (tests)
            self.checkpoints.commit(step, self._driver_state())
        except OSError as error:  # disk full, permissions (a worker's OSError arrives as one too)
            raise self.checkpoints.abort(step, error) from error
        self.last_committed_step = step
        return batch

    # ------------------------------------------------------------------ validation
    def _val_batches(self) -> Iterator[DataProto]:
        size = self.config.data.val_batch_size or len(self.val_dataset)
        for start in range(0, len(self.val_dataset), size):
            items = [self.val_dataset[i] for i in range(start, min(start + size, len(self.val_dataset)))]
            yield DataProto.from_single_dict(self.val_dataset.collate_fn(items))

    def run_validation(self) -> dict[str, float]:
        """Generate with ``rollout.val_kwargs`` on the validation set and score (see validation.py)."""
        if self.val_dataset is None:
            return {}

        def generate(gen: DataProto) -> DataProto:
            gen.meta_info.update(self._generation_meta(validate=True))
            return self.rollout_wg.generate_sequences(gen)

        return run_validation(self._val_batches(), generate, self.val_reward_fn, self.tokenizer,
                              n=self.config.actor_rollout_ref.rollout.val_kwargs.n, step=self.global_steps,
                              num_logged=self.config.trainer.log_val_generations, run_dir=self.run_dir)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_parts(self) -> list[tuple[str, Any]]:
        """``(sub-folder of global_step_N, worker group)`` of every model a checkpoint holds."""
        parts = [("actor", self.actor_rollout_wg)]
        if self.plan.use_critic:
            parts.append(("critic", self.critic_wg))
        return parts

    def _driver_state(self) -> dict[str, Any]:
        return {
            "dataloader": self.train_dataloader.state_dict(),
            "rng": capture_rng_state(),
            "kl_ctrl": self.kl_ctrl_in_reward.state_dict() if self.kl_ctrl_in_reward is not None else None,
            "world_size": self.plan.world_size,
            "total_training_steps": self.total_training_steps,
            "health": self.health.state_dict(),
        }

    def load_checkpoint(self) -> None:
        """Resume per ``trainer.resume_mode`` (auto: latest complete checkpoint, if any)."""
        t = self.config.trainer
        point = self.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path)
        if point is None:
            return
        # Checked before Ray started too; the point may be newer now (auto resume, a restart).
        problems = resume_point_problems(self.config, point)
        if problems:
            raise ValueError(" ".join(problems))
        for name, group in self._checkpoint_parts():
            group.load_checkpoint(os.path.join(point.step_dir, name))
        self.train_dataloader.load_state_dict(point.state["dataloader"])
        restore_rng_state(point.state["rng"])
        if self.kl_ctrl_in_reward is not None and point.state.get("kl_ctrl"):
            self.kl_ctrl_in_reward.load_state_dict(point.state["kl_ctrl"])
        self.health.load_state_dict(point.state.get("health"))
        self.global_steps = point.global_step
        self.resumed_state = point.state
        logger.info("Resumed from %s (step %d)", point.step_dir, self.global_steps)

    # ------------------------------------------------------------------ logging
    def _begin_fit(self) -> dict[str, float]:
        t = self.config.trainer
        os.makedirs(self.run_dir, exist_ok=True)
        self.tracker = Tracking(t.project_name, t.experiment_name, as_backend_list(t.logger), self.run_dir,
                                config=to_container(self.config))
        # Seed the driver's RNGs like a fresh process; a resumed run then restores the saved state.
        _seed_everything(t.seed)
        self.load_checkpoint()
        metrics: dict[str, float] = {}
        if t.val_before_train and self.global_steps == 0 and self.val_dataset is not None:
            timing: dict[str, float] = {}
            with _timed("validate", timing):
                metrics = self.run_validation()
            metrics["timing_s/validate"] = timing["validate"]
            self.tracker.log(metrics, step=0)
        self.progress = ProgressBar(self.total_training_steps, self.global_steps, enabled=t.progress_bar)
        return metrics

    def _end_fit(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.tracker is not None:
            self.tracker.finish()
            if self.config.trainer.plot:
                plot_run(self.tracker.jsonl_path, os.path.join(self.run_dir, PLOT_FILE),
                         title=f"{self.config.trainer.project_name}/{self.config.trainer.experiment_name}")

    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """Add batch/timing/throughput metrics (veRL + AReaL names), send to the trackers."""
        cfg = self.config
        metrics.update(metric_fns.compute_data_metrics(batch, self.plan.use_critic, cfg.data.max_response_length,
                                                       cfg.data.max_prompt_length))
        metrics.update(metric_fns.compute_timing_metrics(batch, timing))
        for name, alias in VERL_TIMING_ALIASES.items():
            if name in timing:
                metrics[f"timing_s/{alias}"] = timing[name]
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        if "update_actor" in timing and "perf/mfu/actor" not in metrics:
            needed = min(1.0, metrics.get("perf/computed_token_frac/update_actor", 1.0))
            mfu = self._actor_mfu(batch, timing["update_actor"], needed)
            if mfu is not None:
                metrics["perf/mfu/actor"] = mfu
        metrics.update(metric_fns.areal_aliases(metrics, batch, self.tokenizer.eos_token_id))
        return self._publish(metrics)

    def _publish(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Stamp the step and epoch, send ``metrics`` to the trackers and the progress bar."""
        metrics["training/global_step"] = self.global_steps
        metrics["training/epoch"] = self.train_dataloader.epoch
        self.tracker.log(metrics, step=self.global_steps)
        self.progress.update(metrics)
        return metrics

    def _actor_mfu(self, batch: DataProto, update_seconds: float, needed_token_frac: float = 1.0) -> Optional[float]:
        """MFU of the update over the tokens it must compute (``needed_token_frac`` of the valid
        tokens: below 1 when the prefix grouper computes a shared prompt once), with the LM head
        counted on the response tokens only (where it runs), as ``benchmarks/bench_step.py`` does.
        The peak is measured in the dtype the update computes in; None when it cannot be measured
        quickly (no MFU rather than a wrong one)."""
        if self._flops is None:
            # fork_rng: the measurement must not advance the driver RNG (resumed runs replay it).
            with components.worker_threads(self.plan), torch.random.fork_rng(devices=[]):
                self._flops = (components.model_param_split(self.config),
                               components.measure_peak_flops(self.plan.device, dtype=self.actor_compute_dtype))
            if self._flops[1] is None:
                logger.info("perf/mfu/actor not reported: a %s matmul peak cannot be measured quickly on "
                            "this %s", self.actor_compute_dtype, self.plan.device)
        (body, head), peak = self._flops
        if peak is None:
            return None
        tokens = float(batch.batch["attention_mask"].sum()) * needed_token_frac
        return metric_fns.compute_actor_mfu(body + head, tokens, self.config.actor_rollout_ref.actor.ppo_epochs,
                                            update_seconds, peak, self.plan.world_size, head_params=head,
                                            head_tokens=float(batch.batch["response_mask"].sum()))
