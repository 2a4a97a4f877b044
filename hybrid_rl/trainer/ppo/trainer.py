"""RayPPOTrainer: the PPO-family mode (PPO/GAE, GRPO, RLOO, REINFORCE++, ReMax, ...) on the trainer core.

One training step is a list of named steps, each a method ``step(batch, metrics) -> batch`` timed
into ``timing_s/<step>``::

    generate -> [compute_reward_baseline] -> [compute_rm_score] -> compute_reward -> [filter_groups]
    -> [compute_old_log_prob | use_rollout_log_probs] -> [compute_ref_log_prob] -> [compute_teacher_log_prob]
    -> [compute_values]
    -> [compute_rollout_correction] -> compute_advantage -> [update_critic] -> update_actor
    -> [dump_rollout] -> [validate] -> [save_checkpoint] -> log

An actor objective whose rows come in pairs (online DPO: ``actor.objective={name: dpo}``) trains on
best-vs-worst pairs of each prompt group instead (:mod:`hybrid_rl.trainer.ppo.paired`)::

    generate -> [compute_rm_score] -> compute_reward -> [filter_groups] -> build_pairs
    -> [compute_ref_log_prob] -> update_actor -> [validate] -> [save_checkpoint] -> log

:func:`~hybrid_rl.trainer.ppo.contracts.ppo_batch_plan` decides from the config which steps run and
declares the batch keys each reads and writes (what the chosen estimator and loss need comes from
their registry info); :meth:`RayPPOTrainer.step_plan` is its names for this step. A variant trainer
overrides ``step_plan`` (to insert or drop a step, declaring it in ``declare_batch_plan``) or a
single step method. The loop, checkpoints, trackers and the validate/save cadence are
:class:`~hybrid_rl.trainer.core.loop.TrainerCore`'s. Only light math runs here; model work runs in the
colocated Ray worker group (one process per device).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from typing import Any, Optional

import numpy as np
import torch

from hybrid_rl.algorithms import get_kl_controller, masked_mean
from hybrid_rl.algorithms.rollout_correction import resolve_preset
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.checks import RunPlan, make_run_plan, resume_point_problems, validate_config
from hybrid_rl.trainer.config.loader import to_ppo_config
from hybrid_rl.trainer.config.paired_checks import paired_notices
from hybrid_rl.trainer.core import generation, inputs, metrics as metric_fns, model_facts, worker_groups
from hybrid_rl.trainer.core.checkpoints import estimate_checkpoint_bytes
from hybrid_rl.trainer.core.dumps import build_dumps, training_part
from hybrid_rl.trainer.core.batch_contract import BatchPlan
from hybrid_rl.trainer.core.loop import TrainerCore
from hybrid_rl.trainer.core.validation import dataset_batches, run_validation
from hybrid_rl.trainer.ppo import agent_rows, contracts as ppo_contracts, learned_reward as reward_model, ops as ppo_ops
from hybrid_rl.trainer.ppo import inputs as ppo_inputs, paired as online_dpo, workers as ppo_workers
from hybrid_rl.trainer.ppo.dynamic_sampling import fill_with_informative_groups

logger = logging.getLogger(__name__)

# veRL's names for the same timings, so veRL dashboards and the benchmarks read them unchanged.
VERL_TIMING_ALIASES = {
    "generate": "gen",
    "compute_reward": "reward",
    "compute_old_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref",
    "compute_teacher_log_prob": "teacher",
    "compute_values": "values",
    "compute_advantage": "adv",
    "validate": "testing",
}


class RayPPOTrainer(TrainerCore):
    """Drives colocated actor/rollout/ref (+ critic) workers through PPO-style training.

    Args:
        config: a DictConfig from :func:`hybrid_rl.trainer.get_config` or a :class:`PPOConfig`.
        tokenizer: defaults to the actor model's tokenizer.
        reward_fn / val_reward_fn: reward managers (``manager(batch, return_dict=True)``); default:
            ``reward_model.reward_manager`` around the custom or built-in scorer, run on the driver.
        train_dataset / val_dataset: prompt datasets; default: built from ``data.*``.
        actor_worker_cls / critic_worker_cls: worker classes to use instead of the default ones.
        for_training: false when the trainer only generates and scores (``eval``, ``debug``).
    """

    def __init__(self, config, tokenizer=None, *, reward_fn=None, val_reward_fn=None, train_dataset=None,
                 val_dataset=None, actor_worker_cls: Optional[type] = None, critic_worker_cls: Optional[type] = None,
                 for_training: bool = True):
        super().__init__(config, tokenizer, train_dataset=train_dataset, val_dataset=val_dataset,
                         worker_classes=(actor_worker_cls, critic_worker_cls), for_training=for_training)
        cfg = self.config
        self.reward_fn = reward_fn or ppo_inputs.build_reward_manager(cfg, self.tokenizer, cfg.reward_model.num_examine)
        self.val_reward_fn = val_reward_fn or ppo_inputs.build_reward_manager(cfg, self.tokenizer, num_examine=0)
        self.remote_rm = reward_model.build_remote_reward_model(cfg)  # None unless reward_model.model.path is a URL
        self.kl_ctrl_in_reward = get_kl_controller(**asdict(cfg.algorithm.kl_ctrl)) if cfg.algorithm.use_kl_in_reward else None
        # ((body, head) params, peak FLOP/s per worker in the actor's compute dtype, or None)
        self._flops: Optional[tuple[tuple[int, int], Optional[float]]] = None
        self._paired: Optional[online_dpo.PairedStep] = None  # this step's rollout when the objective is paired
        self._skips_logged = False  # a step without pairs is logged once
        # trainer.rollout_data_dir / validation_data_dir (None = off); a bad folder stops here in one line
        self.rollout_dumps, self.val_dumps = build_dumps(cfg.trainer, self.tokenizer, config=cfg, device=self.plan.device)

    # ------------------------------------------------------------------ set-up
    def _typed_config(self, config: Any) -> PPOConfig:
        return to_ppo_config(config)

    def check_config(self, training: bool) -> None:
        validate_config(self.config, training=training)
        for notice in paired_notices(self.config):  # online DPO: settings it leaves unused
            logger.warning(notice)
        self.rollout_correction = resolve_preset(self.config.algorithm.rollout_correction)  # the preset's keys filled in

    def make_plan(self) -> RunPlan:
        return make_run_plan(self.config)

    def _build_tokenizer(self) -> Any:
        return ppo_inputs.build_tokenizer(self.config)

    def _report_precision(self) -> str:
        return model_facts.report_precision(self.config, self.plan,
                                           ppo_inputs.compute_dtype_fields(self.config, self.plan))

    def _memory_hint(self) -> str:
        return ppo_workers.memory_hint(self.config)

    def _resume_problems(self, point: Any) -> list[str]:
        return resume_point_problems(self.config, point)

    def _datasets(self, train_dataset, val_dataset) -> tuple[Any, Any]:
        """The given datasets, else the ones ``data.*`` describes (val: None when there is none)."""
        if train_dataset is not None and val_dataset is not None:
            return train_dataset, val_dataset
        train_files, val_files = inputs.resolve_data_files(self.config)
        if train_dataset is None:
            train_dataset = ppo_inputs.build_dataset(train_files, self.tokenizer, self.config)
        if val_dataset is None and val_files:
            val_dataset = ppo_inputs.build_dataset(val_files, self.tokenizer, self.config)
        return train_dataset, val_dataset

    def _checkpoint_bytes(self) -> int:
        """Estimated size of one checkpoint (actor, + critic for GAE), for the disk-space probe."""
        contents = [list(self.config.actor_rollout_ref.actor.checkpoint.save_contents)]
        if self.plan.use_critic:
            contents.append(list(self.config.critic.checkpoint.save_contents))
        return estimate_checkpoint_bytes(model_facts.count_model_params(self.config.actor_rollout_ref.model), contents)

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
        self.workers = ppo_workers.build_worker_groups(
            self.config, self.plan, self.total_training_steps, actor_cls=actor_cls, critic_cls=critic_cls,
            call_timeout_s=self.config.trainer.worker_call_timeout_s, log_dir=os.path.join(self.run_dir, "logs"),
            rollout_rows_per_call=self._rollout_rows_per_call(),
        )

    def _rollout_rows_per_call(self) -> int:
        """Rows the rollout engine should hold at once per worker (:func:`worker_groups.rollout_rows_per_call`)."""
        return worker_groups.rollout_rows_per_call(self.config, self.plan, self.val_dataset,
                                                  self.config.actor_rollout_ref.rollout)

    def declare_batch_plan(self) -> BatchPlan:
        """Every step the config runs, with its batch keys (:func:`~hybrid_rl.trainer.ppo.contracts.ppo_batch_plan`)."""
        return ppo_contracts.ppo_batch_plan(self.config, self.plan, self.rollout_correction)

    def step_plan(self) -> list[str]:
        """Names of the step methods run at ``self.global_steps``, in order (override to customise): the
        steps :func:`~hybrid_rl.trainer.ppo.contracts.ppo_batch_plan` decides from the config, without
        ``update_actor`` during the critic's warm-up, then the cadence."""
        plan = ppo_contracts.ppo_batch_plan(self.config, self.plan, self.rollout_correction)
        warm = self.global_steps > self.config.trainer.critic_warmup
        return [s.name for s in plan.steps if warm or s.name != "update_actor"] + self.cadence_steps()

    # ------------------------------------------------------------------ named steps
    def _generation_meta(self, validate: bool, step: Optional[int] = None) -> dict[str, Any]:
        """Sampling meta_info; ``step`` (default: the current step) seeds a training batch."""
        step = self.global_steps if step is None else step
        return generation.generation_meta(self.tokenizer, self.config.trainer.seed, step, validate)

    def generate(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Repeat each prompt ``rollout.n`` times (shared ``uid``) and sample one response per row."""
        return self.generate_batch(batch, self.global_steps, metrics)

    def generate_batch(self, batch: DataProto, step: int, metrics: dict[str, Any], extra: int = 0) -> DataProto:
        """:meth:`generate` for prompt batch number ``step`` (its uids and seed) on :attr:`rollout_wg`;
        ``extra``: the step's how-many-th additional batch (dynamic sampling: other uids and seeds)."""
        label = step if extra == 0 else f"{step}.{extra}"
        batch = generation.prepare_rollout_batch(batch, self.config.actor_rollout_ref.rollout.n, label)
        gen, rest = generation.split_generation_inputs(batch)
        gen.meta_info.update(self._generation_meta(validate=False, step=step))
        gen.meta_info["seed"] += extra * 1_000_003  # a step's extra batches sample with seeds of their own
        if self.config.actor_rollout_ref.rollout.agent.rows == "every_call":
            agent_rows.number_rollouts(gen)  # a rollout's rows name their input row (agent_rows.py)
        output = self.rollout_wg.generate_sequences(gen)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return generation.merge_generation_output(agent_rows.expand_to_rollout_rows(rest, output), output)

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
        greedy = generation.merge_generation_output(
            DataProto(non_tensor_batch=dict(first.non_tensor_batch)), self.actor_rollout_wg.generate_sequences(gen))
        greedy.batch["token_level_scores"] = self.reward_fn(greedy, return_dict=True)["reward_tensor"]
        if self.config.reward_model.overlong_buffer.enable:  # the baseline pays the same overlong penalty
            ppo_ops.apply_overlong_penalty(greedy, self.config.reward_model.overlong_buffer,
                                           self.config.data.max_response_length)
        baseline = greedy.batch["token_level_scores"].sum(-1)  # [B / n]
        batch.batch["reward_baselines"] = baseline.repeat_interleave(n)  # [B]
        return batch

    def compute_rm_score(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Learned reward model: ``rm_scores`` [B, R] (normalised as trained) and ``rm_raw_scores`` [B]
        from the colocated reward-model workers, or from the remote service (docs/rlhf_pipeline.md)."""
        if self.remote_rm is not None:
            return self._absorb(batch, reward_model.remote_scores(self.remote_rm, batch, self.tokenizer), metrics)
        return self._absorb(batch, self.workers.reward_model.compute_rm_score(batch), metrics)

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
        overlong = self.config.reward_model.overlong_buffer
        if overlong.enable:  # DAPO's soft overlong punishment
            metrics.update(ppo_ops.apply_overlong_penalty(batch, overlong, self.config.data.max_response_length))
        return batch

    def compute_old_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``old_log_probs`` of the sampled tokens under the current actor (+ mean entropy metric)."""
        output = self.actor_rollout_wg.compute_log_prob(batch)
        if "entropys" in output.batch.keys():
            entropys = output.batch.pop("entropys")
            metrics["actor/entropy"] = float(masked_mean(entropys, batch.batch["response_mask"].float()))
            if self.rollout_dumps is not None:  # the dump keeps them: the trajectory viewer colours by entropy
                output.batch["entropys"] = entropys
        return self._absorb(batch, output, metrics)

    def filter_groups(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """DAPO's dynamic sampling: drop the groups whose metric does not vary, generate and score more
        prompt batches until ``data.train_batch_size`` groups remain (:mod:`.dynamic_sampling`)."""
        plan = self.step_plan()
        head = plan[1:plan.index("filter_groups")]  # the scoring steps after generate
        extras = iter(range(1, 1 << 30))

        def next_scored_batch() -> DataProto:
            scratch: dict[str, Any] = {}  # the extra batches' own metrics are not the step's
            more = self.generate_batch(self.next_prompt_batch(), self.global_steps, scratch, next(extras))
            for name in head:
                more = getattr(self, name)(more, scratch)
            return more

        cfg = self.config
        return fill_with_informative_groups(batch, cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout.n,
                                            cfg.data.train_batch_size, next_scored_batch, metrics)

    def use_rollout_log_probs(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Bypass mode: the rollout engine's log-probs are the old log-probs (no recomputation pass)."""
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        return batch

    def compute_rollout_correction(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``rollout_is_weights`` and the rejections of ``algorithm.rollout_correction`` (the response
        mask loses the rejected tokens), with the ``rollout_corr/*`` mismatch metrics."""
        metrics.update(ppo_ops.apply_rollout_correction(batch, self.rollout_correction))
        return batch

    def build_pairs(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Online DPO: the best-vs-worst pairs of each prompt group, interleaved (rows 2i chosen, 2i+1
        rejected; :func:`~hybrid_rl.trainer.ppo.paired.build_pair_batch`), with ``online_dpo/*``."""
        pairs, self._paired, pair_metrics = online_dpo.build_pair_batch(batch, self.plan.world_size)
        metrics.update(pair_metrics)
        return pairs

    def compute_ref_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy (``[0, R]`` for a step without pairs)."""
        if len(batch) == 0:
            batch.batch["ref_log_prob"] = online_dpo.empty_ref_log_prob(batch)
            return batch
        return self._absorb(batch, self.actor_rollout_wg.compute_ref_log_prob(batch), metrics)

    def compute_teacher_log_prob(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``teacher_log_prob`` [B, R]: the sampled tokens under each row's teacher (on-policy
        distillation; the actor's loss reads it)."""
        teachers = self.workers.teacher if self.workers.teacher is not None else self.actor_rollout_wg
        return self._absorb(batch, teachers.compute_teacher_log_prob(batch), metrics)

    def compute_values(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Critic ``values`` per response token."""
        return self._absorb(batch, self.critic_wg.compute_values(batch), metrics)

    def compute_advantage(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Rewards (minus the in-reward KL if enabled), then the registered advantage estimator."""
        alg = self.config.algorithm
        if self.kl_ctrl_in_reward is not None:
            batch, kl_metrics = ppo_ops.apply_kl_penalty(batch, self.kl_ctrl_in_reward, alg.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return ppo_ops.compute_advantage(batch, alg.adv_estimator, gamma=alg.gamma, lam=alg.lam,
                                         norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
                                         components=ppo_ops.reward_components(batch, alg.gdpo_reward_keys),
                                         component_weights=alg.gdpo_reward_weights,
                                         inputs=self.batch_plan.contract("compute_advantage").reads)

    def update_critic(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        output = self.critic_wg.update_critic(batch)
        metrics.update(metric_fns.reduce_metrics(output.meta_info.get("metrics", {})))
        return batch

    def update_actor(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        if self._paired is not None:
            return self._update_on_pairs(batch, metrics)
        if self.rollout_correction.bypass_mode:  # the actor's loss recomputes weights and rejections
            batch.meta_info["rollout_correction"] = asdict(self.rollout_correction)
        if agent_rows.has_rollout_rows(batch):  # a varying number of rows: one mini-batch, zero-mask padding
            padded = agent_rows.pad_for_update(batch, self.plan.world_size)
            padded.meta_info[online_dpo.ONE_OPTIMIZER_STEP] = True
            self._update(self.actor_rollout_wg.update_actor, padded, metrics)
            return batch
        return self._update(self.actor_rollout_wg.update_actor, batch, metrics)

    def _update_on_pairs(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """Online DPO's update: one optimizer step over all of the step's pairs; none without pairs."""
        metrics["online_dpo/update_skipped"] = float(len(batch) == 0)
        if len(batch) == 0:
            if not self._skips_logged:
                logger.warning("online DPO: step %d has no pair (every prompt group tied, or fewer pairs than "
                               "data-parallel workers), so the actor is not updated; online_dpo/update_skipped "
                               "counts such steps (logged once)", self.global_steps)
                self._skips_logged = True
            return batch
        batch.meta_info[online_dpo.ONE_OPTIMIZER_STEP] = True
        return self._update(self.actor_rollout_wg.update_actor, batch, metrics)

    def dump_rollout(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        """``trainer.rollout_data_dir``: the step's scored rows with their log-probs and advantages, in
        veRL's ``{step}.jsonl`` and our sidecar (:mod:`hybrid_rl.trainer.core.dumps`); online DPO dumps
        the whole rollout, as it logs it."""
        rows = self._paired.rollout if self._paired is not None else batch
        self.rollout_dumps.write(self.global_steps, [training_part(rows)])
        return batch

    # ------------------------------------------------------------------ validation
    def run_validation(self) -> dict[str, float]:
        """Generate with ``rollout.val_kwargs`` on the validation set and score (see validation.py)."""
        if self.val_dataset is None:
            return {}

        def generate(gen: DataProto) -> DataProto:
            gen.meta_info.update(self._generation_meta(validate=True))
            return self.rollout_wg.generate_sequences(gen)

        return run_validation(dataset_batches(self.val_dataset, self.config.data.val_batch_size), generate, self.val_reward_fn, self.tokenizer,
                              n=self.config.actor_rollout_ref.rollout.val_kwargs.n, step=self.global_steps,
                              num_logged=self.config.trainer.log_val_generations, run_dir=self.run_dir,
                              dumps=self.val_dumps)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_parts(self) -> list[tuple[str, Any]]:
        """``(sub-folder of global_step_N, worker group)`` of every model a checkpoint holds."""
        parts = [("actor", self.actor_rollout_wg)]
        if self.plan.use_critic:
            parts.append(("critic", self.critic_wg))
        return parts

    def _driver_state(self) -> dict[str, Any]:
        kl_ctrl = self.kl_ctrl_in_reward.state_dict() if self.kl_ctrl_in_reward is not None else None
        return {**super()._driver_state(), "kl_ctrl": kl_ctrl}

    def _load_driver_state(self, state: dict[str, Any]) -> None:
        if self.kl_ctrl_in_reward is not None and state.get("kl_ctrl"):
            self.kl_ctrl_in_reward.load_state_dict(state["kl_ctrl"])

    # ------------------------------------------------------------------ logging
    def log(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> dict[str, float]:
        """Add batch/timing/throughput metrics (veRL + AReaL names), send to the trackers."""
        cfg = self.config
        updated = batch  # what the actor trained on; online DPO logs the whole rollout, as PPO does
        batch = self._paired.rollout if self._paired is not None else batch
        metrics.update(metric_fns.compute_data_metrics(batch, self.plan.use_critic, cfg.data.max_response_length,
                                                       cfg.data.max_prompt_length))
        metrics.update(metric_fns.compute_timing_metrics(batch, timing))
        for name, alias in VERL_TIMING_ALIASES.items():
            if name in timing:
                metrics[f"timing_s/{alias}"] = timing[name]
        metrics.update(metric_fns.compute_throughput_metrics(batch, timing, self.plan.world_size))
        if self._paired is not None:
            self._log_pairs_update(updated, metrics, timing)
        elif "update_actor" in timing and "perf/mfu/actor" not in metrics:
            needed = min(1.0, metrics.get("perf/computed_token_frac/update_actor", 1.0))
            mfu = self._actor_mfu(batch, timing["update_actor"], needed)
            if mfu is not None:
                metrics["perf/mfu/actor"] = mfu
        metrics.update(metric_fns.areal_aliases(metrics, batch, self.tokenizer.eos_token_id))
        return self._publish(metrics)

    def _log_pairs_update(self, pairs: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> None:
        """Online DPO: the update's MFU over the pairs it trained on (none when it was skipped)."""
        self._paired = None
        if len(pairs) and "update_actor" in timing and "perf/mfu/actor" not in metrics:
            needed = min(1.0, metrics.get("perf/computed_token_frac/update_actor", 1.0))
            mfu = self._actor_mfu(pairs, timing["update_actor"], needed)
            if mfu is not None:
                metrics["perf/mfu/actor"] = mfu

    def _actor_mfu(self, batch: DataProto, update_seconds: float, needed_token_frac: float = 1.0) -> Optional[float]:
        """MFU of the update over the tokens it must compute (``needed_token_frac`` of the valid
        tokens: below 1 when the prefix grouper computes a shared prompt once), with the LM head
        counted on the response tokens only (where it runs), as ``benchmarks/bench_step.py`` does.
        The peak is measured in the dtype the update computes in; None when it cannot be measured
        quickly (no MFU rather than a wrong one)."""
        if self._flops is None:
            # fork_rng: the measurement must not advance the driver RNG (resumed runs replay it).
            with model_facts.worker_threads(self.plan), torch.random.fork_rng(devices=[]):
                self._flops = (model_facts.model_param_split(self.config.actor_rollout_ref.model),
                               model_facts.measure_peak_flops(self.plan.device, dtype=self.actor_compute_dtype))
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
