"""Replay one training step from its checkpoint and its dumped batch (``python -m hybrid_rl.debug replay``).

A PPO-family step is ``generate -> compute_reward -> <the steps after scoring> -> cadence``. Replay of
step K loads the checkpoint saved after step K-1 (``global_step_{K-1}``: actor, critic, optimizers,
LR schedulers, the workers' and the driver's RNG, the KL controller; step 1 starts from the model as
the run did), takes step K's batch as the run dumped it (``{K}.batch.pt``, written with
``trainer.dump_replay_batch``), drops the keys the steps after scoring write, and runs those steps
again: the trainer's own step methods, named by its step plan at step K (old log-prob, reference,
values, advantages, critic and actor updates). Then it sets each metric the steps give beside the
one ``metrics.jsonl`` recorded for step K, and the updated weights beside ``global_step_K``'s.

Why it is bit-exact on the recording device and dtype: the update draws nothing from a global RNG
(the model is in eval mode outside the update, and the default model's dropout is 0; the
mini-batch shuffle, ``actor.shuffle``, is seeded by the step and the epoch, and the step rides in
``meta_info["global_steps"]``, set here as the run set it). A model whose config has a dropout above
0 trains with random masks the checkpoint does not fix: replay says so in a note.

Refused, in one line each: a dump from another config (the resolved config in the dump folder's
``meta.json``, keys that do not change the computation aside: :data:`FREE_KEYS`) or another code
(version or git commit); a step without its batch, a missing checkpoint before K; the modes replay does
not cover yet (decoupled, online DPO's paired update, a rollout correction that rejects tokens: it
rewrites ``response_mask`` after scoring, and the dump holds the rewritten mask).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from typing import Any, Optional, Sequence

import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import batch_file, metrics as metric_fns
from hybrid_rl.trainer.core.checkpoints import CheckpointManager

__all__ = ["FREE_KEYS", "SCORING_STEPS", "ReplayInputs", "format_report", "replay_inputs", "replay_step"]

logger = logging.getLogger(__name__)

FREE_KEYS = ("trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir",
             "trainer.resume_mode", "trainer.resume_from_path", "trainer.device", "trainer.single_process",
             "trainer.logger", "trainer.progress_bar", "trainer.log_level", "trainer.plot", "trainer.check_batch",
             "ray_init.num_cpus", "ray_init.address", "data.arithmetic.cache_dir")
"""Config keys a replay may set differently from the run: where files are, which device, how the
workers are hosted, the console. Every other key must equal the run's."""
SCORING_STEPS = ("generate", "compute_reward_baseline", "compute_rm_score", "compute_reward", "filter_groups")
"""Steps that make the batch the dump holds (the rollout and its scores): not re-run."""
NOT_REPLAYED = ("dump_rollout", "validate", "save_checkpoint")
"""Steps after the update that change no model: not re-run."""
MACHINE_METRICS = ("timing", "perf/", "time", "throughput")
"""Metric keys that measure the machine, not the computation: not compared."""
DUMP_KEYS = "trainer.rollout_data_dir=<folder> trainer.dump_replay_batch=true"


@dataclasses.dataclass
class ReplayInputs:
    """What a replay of one step reads, checked before any model is loaded."""

    config: Any
    """The run's typed config, with this replay's device, run folder and resume point."""
    batch_path: str
    """``{rollout_data_dir}/{step}.batch.pt``."""
    meta: dict[str, Any]
    """The dump folder's ``meta.json``."""
    checkpoint: Optional[str]
    """``global_step_{step-1}`` (None for step 1: the run's starting model)."""


# ---------------------------------------------------------------------- checks
def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def config_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: run's value -> this value`` for each key (outside :data:`FREE_KEYS`) that differs."""
    a, b = _flat(recorded), _flat(current)
    keys = sorted(k for k in set(a) | set(b) if not k.startswith(FREE_KEYS) and a.get(k) != b.get(k))
    return [f"{k}={a.get(k, '<absent>')!r} in the run, {b.get(k, '<absent>')!r} here" for k in keys]


def check_meta(meta: dict[str, Any], config: Any, meta_path: str) -> None:
    """ValueError (one line) when the dump was made by other code or with another config."""
    from hybrid_rl.trainer.config.loader import to_container
    from hybrid_rl.utils.redact import redact_config

    here = batch_file.code_identity()
    for key in ("version", "commit"):
        if meta.get(key) != here[key]:
            raise ValueError(f"replay: the dump in {meta_path} was made by hybrid_rl {key} {meta.get(key)!r}, this is "
                             f"{here[key]!r}. Fix: check out that {key} (git checkout {meta.get('commit')}) to replay it.")
    differs = config_differences(meta["config"], redact_config(to_container(config)))
    if differs:
        more = f" (and {len(differs) - 3} more)" if len(differs) > 3 else ""
        raise ValueError(f"replay: the dump in {meta_path} was made with another config: {'; '.join(differs[:3])}"
                         f"{more}. Fix: pass the run's key=value overrides (the config in {meta_path}).")


def _checkpoint_before(run_dir: str, step: int) -> Optional[str]:
    """``global_step_{step-1}`` when complete; None for step 1; ValueError naming trainer.save_freq."""
    if step == 1:
        return None
    manager = CheckpointManager(run_dir)
    path = manager.step_dir(step - 1)
    if manager.is_complete(path):
        return path
    saved = [s for s in manager.list_steps() if manager.is_complete(manager.step_dir(s))]
    raise ValueError(f"replay of step {step} needs the checkpoint saved after step {step - 1} ({path}), which "
                     f"{run_dir} does not hold (its checkpoints: {saved or 'none'}). Fix: rerun with "
                     "trainer.save_freq=1 trainer.max_actor_ckpt_to_keep=null (a checkpoint after every step, all kept).")


def replay_inputs(run_dir: str, step: int, overrides: Sequence[str], device: Optional[str] = None) -> ReplayInputs:
    """The checked inputs of a replay of ``step`` of the run in ``run_dir`` whose config is ``overrides``
    (the run's key=value list; none: the config the run recorded, :func:`recorded_config`); ``device``
    (cpu / cuda): where to replay (default: the config's)."""
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config

    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    if step < 1:
        raise ValueError(f"--step {step}: training steps count from 1. Fix: pass --step 1 or later.")
    extra = [f"trainer.default_local_dir={run_dir}"] + ([f"trainer.device={device}"] if device else [])
    config = to_ppo_config(get_config([*overrides, *extra]) if overrides else recorded_config(run_dir, extra))
    folder = config.trainer.rollout_data_dir
    if folder is None:
        raise ValueError(f"replay reads the batches a run dumped, but trainer.rollout_data_dir is null here. Fix: pass "
                         f"the run's trainer.rollout_data_dir (a run dumps them with {DUMP_KEYS}).")
    folder = os.path.abspath(os.path.expanduser(folder))
    meta_path = os.path.join(folder, batch_file.META_FILE)
    meta = batch_file.read_meta(folder)
    if meta is None:
        raise ValueError(f"{folder} has no {batch_file.META_FILE}: the run did not dump its batches for replay. Fix: "
                         f"rerun with {DUMP_KEYS}.")
    check_meta(meta, config, meta_path)
    _refuse_unsupported(config)
    path = batch_file.batch_path(folder, step)
    if not os.path.isfile(path):
        raise ValueError(f"step {step} has no dumped batch ({path} is missing). Fix: rerun with {DUMP_KEYS} "
                         "(every step is dumped), or replay a step that was.")
    checkpoint = _checkpoint_before(run_dir, step)
    # the dump folder stays (a step may keep what only a dump needs, as the run did); meta.json is the run's
    trainer = dataclasses.replace(config.trainer, dump_replay_batch=False, validation_data_dir=None,
                                  resume_mode="disable" if checkpoint is None else "resume_path",
                                  resume_from_path=checkpoint)
    return ReplayInputs(dataclasses.replace(config, trainer=trainer), path, meta, checkpoint)


def recorded_config(run_dir: str, extra: Sequence[str]) -> Any:
    """The config a run recorded (``{run_dir}/replay.json`` names its dump folder, whose ``meta.json``
    holds it), with ``extra`` (key=value) set over it; ValueError when the run recorded none or hid a secret."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.loader import get_config
    from hybrid_rl.utils.redact import REDACTED

    folder = batch_file.read_pointer(run_dir)
    meta = batch_file.read_meta(folder) if folder else None
    if meta is None:
        raise ValueError(f"{run_dir} names no replay dumps ({batch_file.POINTER_FILE} or the {batch_file.META_FILE} it "
                         f"points to is missing). Fix: pass the run's key=value overrides after --step (its "
                         f"trainer.rollout_data_dir included), or rerun with {DUMP_KEYS}.")
    hidden = [k for k, v in _flat(meta["config"]).items() if isinstance(v, str) and REDACTED in v]
    if hidden:
        raise ValueError(f"{os.path.join(folder, batch_file.META_FILE)} hides {', '.join(hidden)} (secrets are never "
                         "written). Fix: pass the run's key=value overrides after --step, those keys included.")
    return OmegaConf.merge(get_config([]), meta["config"], OmegaConf.from_dotlist(list(extra)))


def _refuse_unsupported(config: Any) -> None:
    """One line for the modes replay does not cover."""
    from hybrid_rl.algorithms.rollout_correction import resolve_preset
    from hybrid_rl.trainer.ppo.paired import paired_objective

    why = None
    if config.async_training.enable:
        why = "async_training.enable=true (the decoupled mode)"
    elif paired_objective(config) is not None:
        why = "a paired actor objective (online DPO: the dump holds the rollout, not the pairs it trained on)"
    elif resolve_preset(config.algorithm.rollout_correction).rollout_rs is not None:
        why = ("algorithm.rollout_correction's rejection (rollout_rs): it rewrites response_mask after scoring, "
               "and the dump holds the rewritten mask")
    if why is not None:
        raise ValueError(f"replay covers the synchronous PPO family; this run uses {why}. Fix: replay a run "
                         "without it.")


# ---------------------------------------------------------------------- the replay
def replayed_steps(plan: Sequence[str]) -> list[str]:
    """The steps of ``plan`` after the scoring ones, without those that change no model."""
    last = max((i for i, name in enumerate(plan) if name in SCORING_STEPS), default=-1)
    return [name for name in plan[last + 1:] if name not in NOT_REPLAYED]


def _strip_derived(trainer: Any, batch: DataProto, names: Sequence[str]) -> None:
    """Drop the keys the replayed steps write, so each step sees the batch it saw in the run."""
    for name in names:
        contract = trainer.batch_plan.contract(name)
        for key in contract.writes if contract is not None else ():
            if batch.batch is not None and key in batch.batch.keys():
                batch.batch.pop(key)
            batch.non_tensor_batch.pop(key, None)


def _dropout_note(config: Any) -> Optional[str]:
    """A note when the model's HF config has a dropout above 0 (not replayed exactly)."""
    path = os.path.join(os.path.expanduser(config.actor_rollout_ref.model.path), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError):
        return None
    active = {k: v for k, v in hf.items() if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, (int, float))
              and v > 0}
    if not active:
        return None
    return (f"the model trains with dropout ({active}): its random masks are not in the checkpoint, so the "
            "update's numbers may differ from the run's")


def _run_steps(trainer: Any, batch: DataProto, names: Sequence[str]) -> dict[str, float]:
    """Run ``names`` on ``batch`` as the loop does; the step's computed metrics."""
    metrics: dict[str, Any] = {}
    for name in names:
        batch = trainer._run_step(name, batch, metrics)
    cfg = trainer.config
    metrics.update(metric_fns.compute_data_metrics(batch, trainer.plan.use_critic, cfg.data.max_response_length,
                                                   cfg.data.max_prompt_length))
    metrics.update(metric_fns.areal_aliases(metrics, batch, trainer.tokenizer.eos_token_id))
    return {k: float(v) for k, v in metrics.items() if not any(part in k for part in MACHINE_METRICS)}


def recorded_metrics(run_dir: str, step: int) -> dict[str, Any]:
    """Step ``step``'s row of ``{run_dir}/metrics.jsonl`` (the last one: a resumed run may repeat it)."""
    from hybrid_rl.trainer.core.tracking import METRICS_FILE

    path, row = os.path.join(run_dir, METRICS_FILE), None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip() and (entry := json.loads(line)).get("step") == step:
                    row = entry
    if row is None:
        raise ValueError(f"{path} has no row of step {step}. Fix: point RUN_DIR at the run's folder "
                         "(trainer.default_local_dir) and replay a step it logged.")
    return row


def compare_metrics(replayed: dict[str, float], recorded: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{key: {recorded, replayed, equal, diff}}`` for each replayed metric (``recorded`` None: not logged)."""
    out = {}
    for key in sorted(replayed):
        mine, theirs = replayed[key], recorded.get(key)
        nan = isinstance(theirs, float) and math.isnan(theirs) and math.isnan(mine)
        equal = theirs is not None and (nan or float(theirs) == mine)
        diff = None if theirs is None or equal else abs(float(theirs) - mine)
        out[key] = {"recorded": theirs, "replayed": mine, "equal": equal, "diff": diff}
    return out


def _model_tensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the ``model*.safetensors`` files of a checkpoint part, by ``file:name``."""
    from safetensors.torch import load_file

    names = sorted(n for n in os.listdir(folder) if n.startswith("model") and n.endswith(".safetensors"))
    return {f"{n}:{k}": v for n in names for k, v in load_file(os.path.join(folder, n)).items()}


def compare_weights(trainer: Any, run_dir: str, step: int) -> dict[str, Any]:
    """``{part: {tensors, equal, max_abs_diff}}``: the replayed models against ``global_step_{step}``'s
    (saved to a temporary folder in the run's layout); {} when the run has no checkpoint of ``step``."""
    manager = CheckpointManager(run_dir)
    if not manager.is_complete(manager.step_dir(step)):
        return {}
    out, scratch = {}, tempfile.mkdtemp(prefix="hybrid_rl_replay_")
    try:
        for name, group in trainer._checkpoint_parts():
            group.save_checkpoint(os.path.join(scratch, name), global_step=step)
            mine, theirs = _model_tensors(os.path.join(scratch, name)), _model_tensors(
                os.path.join(manager.step_dir(step), name))
            if mine.keys() != theirs.keys() or not mine:
                out[name] = {"tensors": len(theirs), "equal": False, "max_abs_diff": None}
                continue
            worst = max(float((mine[k].double() - theirs[k].double()).abs().max()) if mine[k].numel() else 0.0
                        for k in mine)
            out[name] = {"tensors": len(mine), "equal": all(torch.equal(mine[k], theirs[k]) for k in mine),
                         "max_abs_diff": worst}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def replay_step(run_dir: str, step: int, overrides: Sequence[str], device: Optional[str] = None) -> dict[str, Any]:
    """Replay ``step`` of the run in ``run_dir`` (see the module docstring); returns the report:
    ``{step, device, recorded_device, steps, metrics, weights, notes}``."""
    from hybrid_rl.trainer.core.single_process import resolve_single_process
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
    from hybrid_rl.utils.seeding import seed_everything

    inputs = replay_inputs(run_dir, step, overrides, device)
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    recorded = recorded_metrics(run_dir, step)
    trainer = RayPPOTrainer(resolve_single_process(inputs.config))
    try:
        batch = batch_file.load_batch(inputs.batch_path)
        trainer.init_workers()
        seed_everything(trainer.config.trainer.seed)  # as fit() starts; the checkpoint's RNG state follows
        trainer.load_checkpoint()  # global_step_{step-1} (resume_path), or nothing for step 1
        trainer.global_steps = step
        names = replayed_steps(trainer.step_plan())
        _strip_derived(trainer, batch, names)
        metrics = _run_steps(trainer, batch, names)
        weights = compare_weights(trainer, run_dir, step)
    finally:
        trainer.shutdown()
    note = _dropout_note(inputs.config)
    return {"step": step, "device": trainer.plan.device, "recorded_device": inputs.meta.get("device"),
            "checkpoint": inputs.checkpoint, "steps": names, "metrics": compare_metrics(metrics, recorded),
            "not_replayed": sorted(k for k in recorded if k not in metrics and k != "step"),
            "weights": weights, "notes": [note] if note else []}


def same_device(report: dict[str, Any]) -> bool:
    return report["device"] == report["recorded_device"]


def replay_differs(report: dict[str, Any]) -> bool:
    """Whether a metric or a model differs from the run's."""
    return (any(m["recorded"] is not None and not m["equal"] for m in report["metrics"].values())
            or any(not w["equal"] for w in report["weights"].values()))


def format_report(report: dict[str, Any]) -> str:
    """The report as console lines: one per metric, then the weights and the verdict."""
    start = report["checkpoint"] or "the run's starting model"
    lines = [f"replay of step {report['step']} on {report['device']} (recorded on {report['recorded_device']}) from "
             f"{start}: {' -> '.join(report['steps'])}", f"{'metric':<44} {'recorded':>24} {'replayed':>24}  verdict"]
    for key, m in report["metrics"].items():
        verdict = ("not recorded" if m["recorded"] is None else "equal" if m["equal"]
                   else f"differs by {m['diff']:.3g}")
        recorded = "-" if m["recorded"] is None else repr(m["recorded"])
        lines.append(f"{key:<44} {recorded:>24} {m['replayed']!r:>24}  {verdict}")
    for part, w in report["weights"].items():
        verdict = "equal" if w["equal"] else ("differ" if w["max_abs_diff"] is None
                                               else f"differ by up to {w['max_abs_diff']:.3g}")
        lines.append(f"{part} weights vs global_step_{report['step']}/{part} ({w['tensors']} tensors): {verdict}")
    if not report["weights"]:
        lines.append(f"no checkpoint of step {report['step']} to compare the weights with")
    lines.append(f"{len(report['not_replayed'])} recorded metrics come from the rollout, the reward or the clock "
                 "and are not replayed")
    lines += [f"note: {note}" for note in report["notes"]]
    if not same_device(report):
        lines.append(f"replayed on {report['device']}, recorded on {report['recorded_device']}: other kernels round "
                     "differently, so small differences are expected here, not a failure")
    elif replay_differs(report):
        lines.append("NOT bit-identical to the run on the recording device")
    else:
        lines.append("bit-identical to the run")
    return "\n".join(lines)
