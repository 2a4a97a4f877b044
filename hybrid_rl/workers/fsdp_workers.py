"""Ray worker shells: the colocated actor + rollout + reference worker, and the critic worker.

Each registered method unpacks what it needs, calls the plain classes (``DataParallelPPOActor``,
``DataParallelPPOCritic``, the rollout engine, the checkpoint functions) and returns a DataProto.
Batch methods use ``DP_COMPUTE_PROTO`` (the group splits rows over ranks); set-up and checkpoints
use ``ONE_TO_ALL``.

Hybrid-engine weight sync: the worker counts actor weight versions (bumped by every update and
checkpoint load). Before generating, if the rollout has not seen the current version, the full
weights are streamed from the FSDP shards into ``rollout.update_weights`` one tensor at a time,
cast to the rollout dtype — so generation always samples from the actor's current weights.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import Dispatch, Worker, register
from hybrid_rl.utils import faults
from hybrid_rl.utils.memory import current_rss, grad_bytes, module_bytes, optimizer_bytes, phase_peak
from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers import checkpoint as ckpt
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import (build_causal_lm, build_lr_scheduler, build_optimizer,
                                        offload_frozen_to_disk)
from hybrid_rl.workers.config import ActorRolloutRefConfig, derive_batch_sizes
from hybrid_rl.workers.critic import DataParallelPPOCritic
from hybrid_rl.workers.distillation_config import DistillationConfig
from hybrid_rl.workers.fsdp_utils import iter_full_state
from hybrid_rl.workers.lora import (is_lora_model, lora_adapter_weights, lora_base_weights, lora_enabled,
                                    lora_push_config, merged_lora_weights, reference_context)
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path, torch_dtype
from hybrid_rl.workers.optimizer_offload import OptimizerOffload
from hybrid_rl.workers.scalar_worker import ScalarModelWorker
from hybrid_rl.workers.stream_worker import StreamingRolloutMixin
from hybrid_rl.workers.teacher import TeacherMixin
from hybrid_rl.workers.weight_transfer import (DEFAULT_BUCKET_BYTES, WeightExporter, WeightHandle, export_lora,
                                               rollout_aliases)

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref", "teacher")


_OptimizerOffload = OptimizerOffload  # its former name here


class ActorRolloutRefWorker(TeacherMixin, StreamingRolloutMixin, Worker):
    """One device's actor (FSDP2 + AdamW), rollout engine and/or frozen reference policy.

    Args:
        config: the ``actor_rollout_ref`` section.
        role: which parts this process hosts: actor, rollout, ref, actor_ref, actor_rollout,
            actor_rollout_ref, teacher. The decoupled mode runs ``actor(_ref)`` and ``rollout`` in separate
            groups: ``export_rollout_weights`` on the first feeds ``load_rollout_weights`` on the second.
            ``teacher``: only the distillation teachers (their own pool, ``distillation.nnodes`` > 0).
        total_training_steps: steps of the run, for the LR schedule and for whether a CPU rollout
            engine is compiled (from the trainer).
        rollout_rows_per_call: the most rows one ``generate_sequences`` call brings this worker
            (from the trainer; sizes the CPU engine's KV cache when ``cpu_kvcache_space_gib`` is null).
        agent_plugins: the driver's registered tools and interactions
            (:func:`hybrid_rl.agents.plugins.plugin_snapshot`), registered here before the rollout is built.
        distillation: the run's ``distillation`` section: when enabled, the actor's loss adds the
            distillation loss, and the teachers (``compute_teacher_log_prob``) live in the actor's worker
            (colocated) or in the ``teacher`` role's workers (their own pool).
    """

    def __init__(self, config: ActorRolloutRefConfig, role: str,
                 total_training_steps: Optional[int] = None, rollout_rows_per_call: Optional[int] = None,
                 agent_plugins: Optional[dict] = None, distillation: Optional[DistillationConfig] = None):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r} is invalid: must be one of {ROLES}.")
        if not isinstance(config, ActorRolloutRefConfig):
            raise TypeError(f"config must be an ActorRolloutRefConfig, got {type(config).__name__}")
        self.config, self.role = config, role
        self.total_training_steps = total_training_steps
        self.rollout_rows_per_call = rollout_rows_per_call
        self.agent_plugins = agent_plugins
        # on-policy distillation: the training worker hosts the teachers (workers/teacher.py)
        self.distillation = distillation if distillation is not None and distillation.enabled else None
        self._is_actor = role.startswith("actor")
        self._is_rollout = "rollout" in role
        self._is_ref = role.endswith("ref")
        self._hosts_teachers = self.distillation is not None and (
            role == "teacher" if self.distillation.pool_size else self._is_actor)
        self._weights_version = 0  # bumped whenever the actor's weights change
        self._synced_version: Optional[int] = None  # version the rollout holds; None = never synced
        self._ref_weights_file = None  # the reference's weights in a file mapping (ref.disk_offload)

    # ------------------------------------------------------------------ set-up
    def _planned_rollout_tokens(self) -> Optional[int]:
        """At most how many tokens this worker's rollout generates over the run (training calls
        only): steps x rows per call x response_length; None when the trainer did not say."""
        if not self.total_training_steps or not self.rollout_rows_per_call:
            return None
        return self.total_training_steps * self.rollout_rows_per_call * self.config.rollout.response_length

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the process group; build the actor, reference and rollout this role hosts."""
        self.init_process_group()
        self._baseline_rss = current_rss()  # Python, torch, transformers, Ray's worker runtime
        cfg = self.config
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or self.model_path,
                                        trust_remote_code=cfg.model.trust_remote_code)
        use_rmpad = cfg.model.use_remove_padding
        if self._is_actor:
            self._init_actor(use_rmpad)
        if self._is_ref:
            # LoRA: the reference is the actor's own base weights with the adapter disabled (no copy).
            shares_actor = self._is_actor and lora_enabled(cfg.model)
            ref_module = (self.actor_module if shares_actor else
                          build_causal_lm(cfg.model, self.model_path, cfg.ref.fsdp_config, self.device,
                                          trainable=False))
            self._ref_weights_file = (None if shares_actor else
                                      offload_frozen_to_disk(ref_module, cfg.ref.disk_offload, self.device))
            self.ref_policy = DataParallelPPOActor(cfg.actor, ref_module, use_remove_padding=use_rmpad,
                                                   device=self.device,
                                                   attn_implementation=cfg.model.attn_implementation,
                                                   fused_head=cfg.model.use_fused_kernels)
        if self._hosts_teachers:
            self._init_teachers(use_rmpad)
        if self._is_rollout:
            from hybrid_rl.workers.rollout import build_rollout

            if self.agent_plugins:  # tools / interactions registered in the driver (e.g. a notebook)
                from hybrid_rl.agents.plugins import restore_plugins

                restore_plugins(self.agent_plugins)

            self.rollout = build_rollout(cfg.rollout, self.model_path, self.tokenizer, str(self.device),
                                         trust_remote_code=cfg.model.trust_remote_code,
                                         rows_per_call=self.rollout_rows_per_call,
                                         planned_tokens=self._planned_rollout_tokens(),
                                         weight_transfer=not self._is_actor)  # pushes: load_rollout_weights
            if self._is_actor:  # a rollout-only worker never shares its device with training
                # Every generation here syncs first when the engine lost its weights (_generate),
                # so sleep may drop them while the actor trains.
                self.rollout.release_weights_in_sleep = True
                self.rollout.sleep()

    def _init_actor(self, use_rmpad: bool) -> None:
        cfg = self.config
        self.actor_module = build_causal_lm(cfg.model, self.model_path, cfg.actor.fsdp_config,
                                            self.device, trainable=True)
        self.actor_optimizer = build_optimizer(self.actor_module, cfg.actor.optim)
        self.actor_lr_scheduler = build_lr_scheduler(
            self.actor_optimizer, cfg.actor.optim, key="actor_rollout_ref.actor.optim",
            total_training_steps=self.total_training_steps)
        self.optimizer_offload = _OptimizerOffload(self.actor_optimizer,
                                                   cfg.actor.fsdp_config.optimizer_offload, self.device)
        self.batch_sizes = derive_batch_sizes(
            key="actor_rollout_ref.actor", ppo_mini_batch_size=cfg.actor.ppo_mini_batch_size,
            n=cfg.rollout.n, dp_size=self.world_size,
            ppo_micro_batch_size_per_gpu=cfg.actor.ppo_micro_batch_size_per_gpu,
            ppo_micro_batch_size=cfg.actor.ppo_micro_batch_size,
            log_prob_micro_batch_size_per_gpu=cfg.rollout.log_prob_micro_batch_size_per_gpu)
        self.actor = DataParallelPPOActor(
            cfg.actor, self.actor_module, self.actor_optimizer,
            ppo_mini_batch_size_per_gpu=self.batch_sizes.ppo_mini_batch_size_per_gpu,
            ppo_micro_batch_size_per_gpu=self.batch_sizes.ppo_micro_batch_size_per_gpu,
            use_remove_padding=use_rmpad, device=self.device, attn_implementation=cfg.model.attn_implementation,
            fused_head=cfg.model.use_fused_kernels,
            distillation=self.distillation.distillation_loss if self.distillation is not None else None)
        self.optimizer_offload.offload()

    def _require(self, part: str, method: str) -> None:
        if not getattr(self, f"_is_{part}"):
            raise ValueError(f"{method} needs the {part} but this worker's role is {self.role!r}; "
                             "build the group with a role that includes it (e.g. actor_rollout_ref).")

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One response per prompt row, sampled with the actor's current weights."""
        self._require("rollout", "generate_sequences")
        faults.inject("generate_sequences", prompts.meta_info.get("global_steps"))  # no-op unless HYBRID_RL_FAULT (tests)
        metrics: dict[str, Any] = {}
        with phase_peak(metrics, "perf/peak_rss_gib/gen"):
            output = self._generate(prompts, metrics)
        output.meta_info["metrics"] = {**output.meta_info.get("metrics", {}), **metrics}
        return output

    def _generate(self, prompts: DataProto, metrics: dict[str, Any]) -> DataProto:
        if not self._is_actor:  # rollout-only (decoupled mode): weights arrive by load_rollout_weights
            start = time.perf_counter()
            output = self.rollout.generate_sequences(prompts)
            metrics["timing_s/generate_sequences_worker"] = time.perf_counter() - start
            return output
        self.rollout.wake_up()
        try:
            if self._is_actor and (self._synced_version != self._weights_version or self.rollout.needs_weights):
                start = time.perf_counter()
                self.rollout.update_weights(self._rollout_weights())
                self._synced_version = self._weights_version
                metrics["timing_s/weight_sync"] = time.perf_counter() - start
                if is_lora_model(self.actor_module):  # how the adapters reached the engine (docs/lora.md)
                    metrics["rollout/lora_sync_merged"] = 1.0
            start = time.perf_counter()
            output = self.rollout.generate_sequences(prompts)
            metrics["timing_s/generate_sequences_worker"] = time.perf_counter() - start
        finally:
            self.rollout.sleep()
        return output

    def _rollout_weights(self):
        """The actor's full weights for the engine, in the rollout dtype, one tensor at a time; a
        LoRA actor's adapters merged into them (the merge in fp32, cast after it)."""
        dtype = torch_dtype(resolve_dtype(self.config.rollout.dtype, self.device.type, "rollout"))
        if not is_lora_model(self.actor_module):
            return iter_full_state(self.actor_module, dtype=dtype, device=self.device)
        return merged_lora_weights(iter_full_state(self.actor_module, device=self.device), self.actor_module, dtype)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_rollout_weights(self, transport: str = "shm",
                               bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Optional[dict[str, Any]]:
        """The actor's full weights as the rollout engine loads them (rollout dtype, LoRA adapters
        merged), written once (tied weights once) by rank 0 into byte buckets: shared memory
        (``transport="shm"``, same node) or Ray numpy objects (``"object_store"``). Returns
        ``{"weights": WeightHandle}`` (plain metadata, no tensor) on rank 0, None on the other ranks
        (they only take part in the FSDP gathers). Pass it to the rollout group's
        ``load_rollout_weights``, then to ``release_rollout_weights``. A LoRA actor pushes its base
        weights once and then the adapter factors alone; the receiver merges them (docs/async.md)."""
        self._require("actor", "export_rollout_weights")
        if is_lora_model(self.actor_module):
            return self._export_lora_weights(transport, bucket_bytes)
        if self.rank != 0:
            for _ in self._rollout_weights():  # the collective gathers, nothing kept
                pass
            return None
        if getattr(self, "_weight_exporter", None) is None:
            self._weight_exporter = WeightExporter()  # sweeps dead exporters' segments
        handle = self._weight_exporter.export(self._rollout_weights(), rollout_aliases(self.actor_module),
                                              transport, bucket_bytes)
        return {"weights": handle}

    def _export_lora_weights(self, transport: str, bucket_bytes: int) -> Optional[dict[str, Any]]:
        """A LoRA actor's push: the base weights on the first push (pinned for the later ones, and again
        when the transport changes), the adapter factors alone on every push (docs/async.md)."""
        dtype = torch_dtype(resolve_dtype(self.config.rollout.dtype, self.device.type, "rollout"))
        # Decided alike on every rank before any gather (the gathers are collective): a rank-0 export
        # that fails after this is refused at the next push, never answered with mismatched gathers.
        send_base = getattr(self, "_lora_base_transport", None) != transport
        self._lora_base_transport = transport
        base = (lora_base_weights(iter_full_state(self.actor_module, device=self.device), self.actor_module, dtype)
                if send_base else None)
        adapters = lora_adapter_weights(self.actor_module, device=self.device)
        if self.rank != 0:
            for _ in base or ():  # the collective gathers, nothing kept
                pass
            for _ in adapters:
                pass
            return None
        if getattr(self, "_weight_exporter", None) is None:
            self._weight_exporter = WeightExporter()  # sweeps dead exporters' segments
        handle = export_lora(self._weight_exporter, adapters, base, rollout_aliases(self.actor_module),
                             lora_push_config(self.actor_module, dtype), transport, bucket_bytes)
        return {"weights": handle}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def release_rollout_weights(self, handle: WeightHandle) -> Optional[int]:
        """Free a push's buckets once every rollout worker loaded it (or a newer push replaced it);
        returns the number of buckets freed on rank 0."""
        exporter = getattr(self, "_weight_exporter", None)
        return exporter.release(handle) if self.rank == 0 and exporter is not None else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_weight_exports(self) -> None:
        """Unlink every push and spare segment this worker still holds in shared memory (the end of a run:
        Ray stops its workers without calling :meth:`close`); a later export starts afresh."""
        exporter, self._weight_exporter = getattr(self, "_weight_exporter", None), None
        self._lora_base_transport = None  # the pinned LoRA base goes with the exporter: the next push resends it
        if exporter is not None:
            exporter.close()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_rollout_weights(self, weights: WeightHandle) -> dict[str, float]:
        """Load a push from ``export_rollout_weights`` into a rollout-only worker's engine (zero-copy
        views of the buckets); returns ``{"timing_s/weight_load": seconds}``."""
        self._require("rollout", "load_rollout_weights")
        if self._is_actor:
            raise ValueError(f"load_rollout_weights is for rollout-only workers; role {self.role!r} syncs its "
                             "rollout from its own actor before each generation.")
        start = time.perf_counter()
        self.rollout.load_weight_push(weights)  # vLLM: through its weight-transfer protocol (vllm_engine.py)
        return {"timing_s/weight_load": time.perf_counter() - start}

    # ------------------------------------------------------------------ log-probs
    def _log_prob_meta(self, data: DataProto, micro_batch_size: Optional[int], use_dynamic_bsz: bool,
                       max_token_len: int) -> DataProto:
        """A view of ``data`` with the micro-batching meta_info the actor reads (input untouched)."""
        meta = dict(data.meta_info, temperature=self.config.rollout.temperature,
                    micro_batch_size=micro_batch_size, use_dynamic_bsz=use_dynamic_bsz,
                    max_token_len=max_token_len)
        return DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` [B, R] under the current actor."""
        self._require("actor", "compute_log_prob")
        a, r = self.config.actor, self.config.rollout
        dynamic = a.use_dynamic_bsz if r.log_prob_use_dynamic_bsz is None else r.log_prob_use_dynamic_bsz
        view = self._log_prob_meta(data, self.batch_sizes.log_prob_micro_batch_size_per_gpu, dynamic,
                                   r.log_prob_max_token_len_per_gpu or a.ppo_max_token_len_per_gpu)
        metrics: dict[str, Any] = {}
        start = time.perf_counter()
        with phase_peak(metrics, "perf/peak_rss_gib/old_log_prob"):
            log_probs, entropys = self.actor.compute_log_prob(view, calculate_entropy=True)
        metrics.update({"timing_s/compute_log_prob_worker": time.perf_counter() - start,
                        "perf/computed_token_frac/old_log_prob": self.actor.pop_computed_token_frac()})
        return DataProto.from_dict({"old_log_probs": log_probs, "entropys": entropys},
                                   meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` [B, R] under the frozen reference policy."""
        self._require("ref", "compute_ref_log_prob")
        r = self.config.ref
        view = self._log_prob_meta(data, r.log_prob_micro_batch_size_per_gpu,
                                   r.log_prob_use_dynamic_bsz, r.log_prob_max_token_len_per_gpu)
        metrics: dict[str, Any] = {}
        start = time.perf_counter()
        with phase_peak(metrics, "perf/peak_rss_gib/ref"), reference_context(self.ref_policy.actor_module):
            log_probs, _ = self.ref_policy.compute_log_prob(view)
            if self._ref_weights_file is not None:
                self._ref_weights_file.release()  # out of memory while the actor trains (ref.disk_offload)
        metrics.update({"timing_s/compute_ref_log_prob_worker": time.perf_counter() - start,
                        "perf/computed_token_frac/ref": self.ref_policy.pop_computed_token_frac()})
        return DataProto.from_dict({"ref_log_prob": log_probs}, meta_info={"metrics": metrics})

    # ------------------------------------------------------------------ training
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update on this rank's rows; returns ``meta_info["metrics"]`` (veRL names)."""
        self._require("actor", "update_actor")
        faults.inject("update_actor", data.meta_info.get("global_steps"))  # no-op unless HYBRID_RL_FAULT (tests)
        view = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch,
                         meta_info=dict(data.meta_info, temperature=self.config.rollout.temperature))
        start = time.perf_counter()
        peak: dict[str, float] = {}
        with phase_peak(peak, "perf/peak_rss_gib/update_actor"), self.optimizer_offload:
            metrics = self.actor.update_policy(view)
        metrics.update(peak)
        metrics["perf/computed_token_frac/update_actor"] = self.actor.pop_computed_token_frac()
        self._weights_version += 1
        metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
        self.actor_lr_scheduler.step()
        metrics["timing_s/update_actor_worker"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def memory_breakdown(self) -> dict[str, int]:
        """Bytes this process holds now, per owner, counted from the live tensors (each storage
        once): actor parameters / gradients / optimizer state, the reference's own copy (0 when
        it shares the actor's base, as with LoRA), the rollout engine's weights and KV cache;
        ``process/rss`` and ``process/baseline_rss`` (RSS before any model was built)."""
        seen: set = set()
        owners = {"process/rss": current_rss(), "process/baseline_rss": self._baseline_rss}
        if self._is_actor:
            owners.update({"actor/params": module_bytes(self.actor_module, seen),
                           # gradients live only inside an update: the bytes held at its last step
                           "actor/grads": max(grad_bytes(self.actor_module, seen), self.actor.last_grad_bytes),
                           "actor/optimizer": optimizer_bytes(self.actor_optimizer, seen)})
        if self._is_ref:
            params = module_bytes(self.ref_policy.actor_module, seen)
            mapped = self._ref_weights_file is not None  # then resident only during the reference pass
            owners.update({"ref/params": 0 if mapped else params, "ref/params_on_disk": params if mapped else 0})
        if self._is_rollout:
            owners.update(self.rollout.memory_owners(seen))
        return owners

    def close(self) -> None:
        """Stop the rollout engine (its threads and memory) when this worker shares the driver's process."""
        rollout = getattr(self, "rollout", None)
        if rollout is not None:
            rollout.shutdown()
            self.rollout = None
        exporter = getattr(self, "_weight_exporter", None)
        if exporter is not None:  # unlink every push still in shared memory
            exporter.close()

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None, global_step: int = 0,
                        max_ckpt_to_keep: Optional[int] = None) -> None:
        """Write the actor (model, optimizer, LR scheduler, RNG) to ``local_path`` atomically.

        ``hdfs_path``/``max_ckpt_to_keep`` are accepted for veRL call compatibility; remote copies
        and rotation are the trainer's checkpoint manager's job.
        """
        self._require("actor", "save_checkpoint")
        faults.inject("save_checkpoint", global_step)  # no-op unless HYBRID_RL_FAULT (tests)
        c = self.config.actor.checkpoint
        ckpt.save_checkpoint(local_path, model=self.actor_module, optimizer=self.actor_optimizer,
                             lr_scheduler=self.actor_lr_scheduler, hf_config=self.actor_module.config,
                             tokenizer=self.tokenizer, contents=tuple(c.save_contents),
                             state_dict_type=c.state_dict_type, global_step=global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None,
                        del_local_after_load: bool = False) -> None:
        """Restore what ``actor.checkpoint.load_contents`` names; the rollout re-syncs next time."""
        self._require("actor", "load_checkpoint")
        with self.optimizer_offload:
            ckpt.load_checkpoint(local_path, model=self.actor_module, optimizer=self.actor_optimizer,
                                 lr_scheduler=self.actor_lr_scheduler,
                                 contents=tuple(self.config.actor.checkpoint.load_contents))
        self._weights_version += 1


class CriticWorker(ScalarModelWorker):
    """One device's value model (FSDP2 + AdamW): values and clipped value-loss updates
    (:class:`~hybrid_rl.workers.critic.DataParallelPPOCritic`); a sibling of the reward-model worker.

    Args:
        config: the ``critic`` section.
        total_training_steps: steps of the run, for the LR schedule (from the trainer).
    """

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the process group; build the value model, its optimizer and LR schedule."""
        sizes = self.build_scalar_model()
        cfg = self.config
        self.critic = DataParallelPPOCritic(cfg, self.module, self.optimizer,
                                            ppo_mini_batch_size_per_gpu=sizes.ppo_mini_batch_size_per_gpu,
                                            ppo_micro_batch_size_per_gpu=sizes.ppo_micro_batch_size_per_gpu,
                                            use_remove_padding=cfg.model.use_remove_padding,
                                            device=self.device,
                                            attn_implementation=cfg.model.attn_implementation)
        self.optimizer_offload.offload()

    @property
    def critic_module(self):
        """The value model (``module``)."""
        return self.module

    @property
    def critic_optimizer(self):
        """Its optimizer (``optimizer``)."""
        return self.optimizer

    @property
    def critic_lr_scheduler(self):
        """Its LR schedule (``lr_scheduler``)."""
        return self.lr_scheduler

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` [B, R] (zero outside the response mask)."""
        metrics: dict[str, Any] = {}
        with phase_peak(metrics, "perf/peak_rss_gib/values"):
            values = self.critic.compute_values(data)
        return DataProto.from_dict({"values": values}, meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss update; returns ``meta_info["metrics"]``."""
        start = time.perf_counter()
        peak: dict[str, float] = {}
        with phase_peak(peak, "perf/peak_rss_gib/update_critic"), self.optimizer_offload:
            metrics = self.critic.update_critic(data)
        metrics.update(peak)
        metrics["critic/lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        metrics["timing_s/update_critic_worker"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})
