"""The teacher role of on-policy distillation, hosted beside the reference in the training worker.

A teacher is a frozen causal LM scoring the student's samples: the same packed forward as the
reference (:class:`~hybrid_rl.workers.actor.DataParallelPPOActor`'s ``compute_log_prob``) on the same
ids, with the teacher's weights. It is built like the reference (frozen, stored in its compute dtype,
on CPU out of the resident set between passes: ``disk_offload``), with the teacher's own dtype and
micro-batching. Several teachers each score the rows whose ``distillation.teacher_key`` field equals
their ``key``. Teachers score at temperature 1 (:data:`TEACHER_TEMPERATURE`), whatever the rollout's,
as veRL 0.9.1's teacher does (its vLLM ``prompt_logprobs`` are always taken at T=1).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from hybrid_rl.algorithms.distillation import distillation_loss_info
from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import Dispatch, register
from hybrid_rl.utils.memory import phase_peak
from hybrid_rl.workers.batching import all_reduce_max_int
from hybrid_rl.workers.distillation_config import DistillationConfig, TeacherModelConfig

__all__ = ["TEACHER_TEMPERATURE", "TeacherMixin", "route_rows", "rows_on_every_rank"]

TEACHER_TEMPERATURE = 1.0
"""The teacher's softmax temperature: its own distribution, not the rollout's sampling temperature
(veRL 0.9.1 forces 1.0 for the teacher; the student's log-probs stay at the rollout temperature)."""


def route_rows(data: DataProto, teachers: dict[str, TeacherModelConfig], teacher_key: str,
               device: Any = None) -> dict[str, np.ndarray]:
    """Row indices each teacher scores: every row for a single teacher, else the rows whose
    ``teacher_key`` field equals its ``key``; a row no teacher takes is a ValueError naming its value.
    With ``device`` (the data-parallel collectives' device) the ranks first agree on whether any of
    them holds such a row, and then every rank raises the same error: a rank raising alone would
    leave the others waiting in :func:`rows_on_every_rank`'s all-reduce until the collective timeout."""
    rows = np.arange(len(data))
    if len(teachers) == 1:
        return {name: rows for name in teachers}
    if teacher_key not in data.non_tensor_batch:
        raise ValueError(f"distillation.teacher_key={teacher_key!r}: the rows have no such field (they have "
                         f"{sorted(data.non_tensor_batch)}); set it to the field that names each row's teacher.")
    values = np.asarray(data.non_tensor_batch[teacher_key]).astype(str)
    routed = {name: rows[values == str(t.key)] for name, t in teachers.items()}
    orphans = sorted({str(v) for v in values} - {str(t.key) for t in teachers.values()})
    if device is not None and all_reduce_max_int(int(bool(orphans)), device):
        orphans = _orphans_of_every_rank(orphans)
    if orphans:
        raise ValueError(f"distillation: rows with {teacher_key}={orphans} have no teacher (keys: "
                         f"{[t.key for t in teachers.values()]}); add a teacher with that key.")
    return routed


def _orphans_of_every_rank(orphans: list[str]) -> list[str]:
    """The union over the data-parallel ranks of their rows' teacher-less values (once some rank has one)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return orphans
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, orphans)
    return sorted(set().union(*gathered))


def rows_on_every_rank(idx: np.ndarray, num_rows: int, device: Any) -> np.ndarray:
    """``idx`` (this rank's rows of one teacher) followed by filler rows, to the largest count over the
    data-parallel ranks. Every rank then runs the teacher's forward on as many rows, so its FSDP
    all-gathers and the dynamic batch's all-reduce meet the other ranks' (a rank with fewer or no rows
    of a teacher would otherwise skip passes and hang the others). The fillers repeat this rank's rows
    (its batch's first rows when it has none of this teacher's); their outputs are dropped."""
    target = all_reduce_max_int(len(idx), device)
    if target == len(idx):
        return idx
    pool = idx if len(idx) else np.arange(num_rows)
    fill = np.resize(pool, target - len(idx))  # cycles through ``pool``
    return np.concatenate([idx, fill]).astype(np.int64)


class TeacherMixin:
    """``compute_teacher_log_prob`` for :class:`~hybrid_rl.workers.fsdp_workers.ActorRolloutRefWorker`
    (which provides ``config``, ``device`` and ``_log_prob_meta``)."""

    distillation: Optional[DistillationConfig] = None

    def _init_teachers(self, use_rmpad: bool) -> None:
        """Build every teacher with a model path (frozen, as the reference is built)."""
        from hybrid_rl.workers.actor import DataParallelPPOActor
        from hybrid_rl.workers.builders import build_causal_lm, offload_frozen_to_disk
        from hybrid_rl.workers.model_loader import model_vocab_size, resolve_model_path

        cfg = self.config
        self.teachers: dict[str, tuple[TeacherModelConfig, Any, Any]] = {}
        for name, teacher in self.distillation.active_teachers().items():
            path = resolve_model_path(teacher.model_path, key=f"distillation.teacher_models.{name}.model_path")
            fsdp = cfg.ref.fsdp_config
            if teacher.dtype != "auto":
                fsdp = dataclasses.replace(fsdp, mixed_precision=dataclasses.replace(
                    fsdp.mixed_precision, param_dtype=teacher.dtype))
            model_cfg = dataclasses.replace(cfg.model, path=path, lora_rank=0, override_config={})
            module = build_causal_lm(model_cfg, path, fsdp, self.device, trainable=False)
            weights = offload_frozen_to_disk(module, teacher.disk_offload, self.device)
            policy = DataParallelPPOActor(cfg.actor, module, use_remove_padding=use_rmpad, device=self.device,
                                          attn_implementation=cfg.model.attn_implementation,
                                          fused_head=cfg.model.use_fused_kernels)
            self.teachers[name] = (teacher, policy, weights)
        # a teacher padded wider than the student picks its top-K below the student's logit width
        self.student_vocab_size = model_vocab_size(cfg.model.path, "actor_rollout_ref.model.path",
                                                   trust_remote_code=cfg.model.trust_remote_code,
                                                   override_config=dict(cfg.model.override_config or {}))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """``teacher_log_prob`` [B, R]: each row's sampled tokens under its teacher; for a top-K loss
        also ``teacher_topk_log_probs`` and ``teacher_topk_ids`` [B, R, K]."""
        if not getattr(self, "teachers", None):
            raise ValueError("compute_teacher_log_prob needs distillation.enabled=true with a teacher model_path.")
        ref, loss = self.config.ref, self.distillation.distillation_loss
        k = loss.topk if distillation_loss_info(loss.loss_mode).use_topk else None
        metrics: dict[str, Any] = {}
        shape = data.batch["responses"].shape
        out = {"teacher_log_prob": torch.zeros(shape, dtype=torch.float32)}
        if k:
            out.update(teacher_topk_log_probs=torch.zeros(*shape, k, dtype=torch.float32),
                       teacher_topk_ids=torch.zeros(*shape, k, dtype=torch.long))
        start = time.perf_counter()
        configs = {name: entry[0] for name, entry in self.teachers.items()}
        with phase_peak(metrics, "perf/peak_rss_gib/teacher"):
            for name, idx in route_rows(data, configs, self.distillation.teacher_key, self.device).items():
                padded = rows_on_every_rank(idx, len(data), self.device) if len(configs) > 1 else idx
                if len(padded) == 0:  # no rank has rows for this teacher: every rank skips it
                    continue
                teacher, policy, weights = self.teachers[name]
                micro = teacher.log_prob_micro_batch_size_per_gpu or ref.log_prob_micro_batch_size_per_gpu
                max_len = teacher.log_prob_max_token_len_per_gpu or ref.log_prob_max_token_len_per_gpu
                view = self._log_prob_meta(data.select_idxs(padded), micro, ref.log_prob_use_dynamic_bsz, max_len)
                view.meta_info["temperature"] = TEACHER_TEMPERATURE  # not the rollout's (veRL's teacher: T=1)
                rows, real = torch.as_tensor(idx, dtype=torch.long), len(idx)  # fillers come after the real rows
                if k:
                    values, ids, log_probs = policy.compute_topk(view, k, vocab_limit=self.student_vocab_size)
                    out["teacher_topk_log_probs"][rows], out["teacher_topk_ids"][rows] = values[:real], ids[:real]
                else:
                    log_probs, _ = policy.compute_log_prob(view)
                out["teacher_log_prob"][rows] = log_probs[:real].float()
                if weights is not None:
                    weights.release()  # out of memory until the next pass (disk_offload)
        metrics["timing_s/compute_teacher_log_prob_worker"] = time.perf_counter() - start
        return DataProto.from_dict(out, meta_info={"metrics": metrics})
