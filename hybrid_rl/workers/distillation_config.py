"""``distillation.*``: on-policy distillation's config, with veRL 0.9's keys and defaults.

veRL's ``distillation.yaml`` (v0.9.0) and ``verl/workers/config/distillation.py`` are the reference.
Differences: the teacher here is a worker role (its log-probs computed by the same packed forward as
the reference's), not a vLLM server pool, so ``teacher_models.<name>.inference`` and ``num_replicas``
are not keys; a teacher has the reference's own settings instead (``dtype``, ``disk_offload``,
micro-batching). It is colocated with the training workers by default (``nnodes: 0``); ``nnodes`` x
``n_gpus_per_node`` > 0 gives the teachers their own pool, as veRL's always does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields
from typing import Any, Optional

from hybrid_rl.utils.bounds import bound_problems, bounded

__all__ = ["DistillationConfig", "DistillationLossConfig", "TeacherModelConfig", "POLICY_LOSS_MODES"]

POLICY_LOSS_MODES = ("vanilla",)
"""Policy losses a distillation reward trains with (veRL 0.9 has ``vanilla`` only)."""


@dataclass
class DistillationLossConfig:
    """How the teacher's scores train the student (veRL's ``distillation.distillation_loss``)."""

    loss_mode: str = "k3"
    """Per-token loss: an estimator on the sampled token (``k3``/``low_var_kl``: its gradient descends the
    forward KL(teacher || student); ``k2``/``mse``: the reverse KL(student || teacher); ``k1``/``kl``: a
    reward only; ``abs``: the total variation) or ``forward_kl_topk`` (KL(teacher || student) over the
    teacher's top-``topk`` tokens). Registered entries: hybrid_rl.algorithms.distillation."""
    topk: Optional[int] = bounded(32, ge=1, fix="use e.g. 32")
    """K of ``forward_kl_topk``: the teacher's most likely tokens scored per position."""
    use_task_rewards: bool = True
    """Train on the task reward too: loss = policy loss + distillation_loss_coef x distillation loss.
    false: the distillation loss alone (the policy, entropy and reference-KL terms drop out)."""
    distillation_loss_coef: float = bounded(1.0, ge=0, fix="use e.g. 1.0")
    """Weight of the distillation loss beside the task's policy loss (1 without task rewards)."""
    loss_max_clamp: Optional[float] = bounded(None, gt=0, fix="use null (no clamp) or e.g. 10")
    """Clamp each token's loss to [-loss_max_clamp, loss_max_clamp]; null: no clamp."""
    log_prob_min_clamp: Optional[float] = None
    """``forward_kl_topk``: clamp both top-K log-probs from below first; null: no clamp."""
    use_policy_gradient: bool = False
    """true: the negated per-token loss is a reward (advantage) for the clipped policy loss (Thinking
    Machines' on-policy distillation; k1 works here); false: the loss is backpropagated directly."""
    policy_loss_mode: str = "vanilla"
    """The policy loss of ``use_policy_gradient`` (veRL: vanilla only)."""
    clip_ratio: float = bounded(0.2, ge=0, fix="use e.g. 0.2")
    """``use_policy_gradient``: PPO clip (both sides unless clip_ratio_low/high say otherwise)."""
    clip_ratio_low: Optional[float] = bounded(0.2, ge=0, fix="use e.g. 0.2")
    """``use_policy_gradient``: lower clip, ratio >= 1 - clip_ratio_low (null: clip_ratio)."""
    clip_ratio_high: Optional[float] = bounded(0.2, ge=0, fix="use e.g. 0.2")
    """``use_policy_gradient``: upper clip, ratio <= 1 + clip_ratio_high (null: clip_ratio)."""

    def clip_bounds(self) -> tuple[float, float]:
        """``(low, high)`` of the policy-gradient clip."""
        low = self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low
        high = self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high
        return low, high

    def problems(self, prefix: str = "distillation.distillation_loss") -> list[str]:
        """One line per wrong setting (key, value, fix)."""
        from hybrid_rl.algorithms.distillation import distillation_loss_info, registered_distillation_losses

        if self.loss_mode not in registered_distillation_losses():
            return [f"{prefix}.loss_mode={self.loss_mode!r} is not a registered distillation loss; use one of "
                    f"{registered_distillation_losses()} or register yours first."]
        errors = []
        info = distillation_loss_info(self.loss_mode)
        if info.needs_policy_gradient and not self.use_policy_gradient:
            errors.append(f"{prefix}.loss_mode={self.loss_mode} backpropagated directly has a gradient that does not "
                          f"depend on the teacher; set {prefix}.use_policy_gradient=true or loss_mode=k3.")
        if info.use_topk and self.topk is None:  # < 1: its declared bound
            errors.append(f"{prefix}.topk={self.topk!r} must be a positive integer for loss_mode={self.loss_mode}.")
        if self.policy_loss_mode not in POLICY_LOSS_MODES:
            errors.append(f"{prefix}.policy_loss_mode={self.policy_loss_mode!r} must be one of {POLICY_LOSS_MODES}.")
        return errors


@dataclass
class TeacherModelConfig:
    """One teacher (veRL's ``distillation.teacher_models.<name>``)."""

    key: Optional[str] = None
    """The value of the row field ``distillation.teacher_key`` this teacher scores (several teachers);
    null with one teacher: every row."""
    model_path: Optional[str] = None
    """Local HF folder of the teacher (or the embedded model's id). Its tokenizer must be the student's."""
    dtype: str = "auto"
    """Compute dtype of the teacher's forward (auto: the reference's choice for this device)."""
    disk_offload: Optional[bool] = None
    """CPU: keep the teacher's weights in a file mapping, out of the resident set between passes;
    null: as ``actor_rollout_ref.ref.disk_offload``'s null (automatic)."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = bounded(None, ge=1, fix="use null or a positive number of rows")
    """Rows per teacher forward (null: the reference's setting)."""
    log_prob_max_token_len_per_gpu: Optional[int] = bounded(None, ge=1, fix="use null or a positive token budget")
    """Tokens per teacher forward with dynamic batch sizes (null: the reference's setting)."""


def _one_teacher() -> dict[str, TeacherModelConfig]:
    return {"teacher_model": TeacherModelConfig()}


def _teacher(name: str, value: Any) -> TeacherModelConfig:
    """``value`` (a TeacherModelConfig or a mapping of its keys) as a TeacherModelConfig; a
    ValueError naming the key otherwise."""
    if isinstance(value, TeacherModelConfig):
        return value
    known = [f.name for f in fields(TeacherModelConfig)]
    if not hasattr(value, "items"):
        raise ValueError(f"distillation.teacher_models.{name}={value!r} must be a mapping of {known}.")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"distillation.teacher_models.{name}: unknown keys {unknown}; a teacher has {known}.")
    return TeacherModelConfig(**dict(value))


@dataclass
class DistillationConfig:
    """On-policy distillation (veRL's ``distillation``): teachers score the student's samples."""

    enabled: bool = False
    """Score every response with the teacher(s) and train the student on the distillation loss."""
    teacher_key: str = "data_source"
    """The row field whose value picks a row's teacher (``teacher_models.<name>.key``) with several teachers."""
    teacher_models: dict[str, Any] = field(default_factory=_one_teacher)
    """The teachers by name (each a :class:`TeacherModelConfig`); one (``teacher_model``) by default.
    Add one from the command line with ``+distillation.teacher_models.<name>={model_path:...,key:...}``."""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    """The loss and how it trains the student."""
    nnodes: int = bounded(0, ge=0, fix="use 0 (colocated) or the pool's node count")
    """Nodes of the teachers' own worker pool; 0 (the default): the teachers live in the training
    workers, beside the reference (colocated). With a pool, every pool worker hosts every teacher and
    scores its share of the rows (Ray only)."""
    n_gpus_per_node: int = bounded(1, ge=1, fix="use 1 or more")
    """Devices (CPU: worker processes) per node of the teachers' pool (read only when ``nnodes`` > 0;
    veRL's YAML default is 8 GPUs, 1 here so that ``nnodes=1`` alone asks for one worker)."""

    @property
    def pool_size(self) -> int:
        """Workers of the teachers' own pool; 0 when the teachers are colocated (or disabled)."""
        return self.nnodes * self.n_gpus_per_node if self.enabled else 0

    def __post_init__(self) -> None:
        self.teacher_models = {name: _teacher(name, t) for name, t in dict(self.teacher_models).items()}

    def active_teachers(self) -> dict[str, TeacherModelConfig]:
        """The teachers that have a model path."""
        return {name: t for name, t in self.teacher_models.items() if t.model_path}

    def problems(self) -> list[str]:
        """One line per wrong setting (nothing is checked while disabled)."""
        if not self.enabled:
            return []
        errors = self.distillation_loss.problems()
        for name, teacher in self.teacher_models.items():
            errors.extend(bound_problems(teacher, f"distillation.teacher_models.{name}."))
        teachers = self.active_teachers()
        if not teachers:
            errors.append("distillation.enabled=true needs a teacher: set "
                          "distillation.teacher_models.teacher_model.model_path to a local HF folder.")
        if len(teachers) > 1:
            missing = sorted(name for name, t in teachers.items() if t.key is None)
            if missing:
                errors.append(f"distillation.teacher_models: with {len(teachers)} teachers each needs a key (the "
                              f"{self.teacher_key} value it scores); {missing} have none.")
            keys = [t.key for t in teachers.values() if t.key is not None]
            if len(set(keys)) != len(keys):
                errors.append(f"distillation.teacher_models: keys {keys} repeat; give each teacher its own.")
        return errors
