"""Prompt groups for the streaming producer: one group = one prompt's ``rollout.n`` rows.

Pure driver-side plumbing (no Ray, no engine): :func:`split_groups` cuts a prepared prompt batch (repeated
``n`` times, interleaved, with ``uid``) into groups; :func:`group_requests` turns a group into the engine's
stream requests; :func:`assemble_group` builds the group's rollout batch from the finished samples, in the
layout the batch path produces (``build_rollout_output``) plus ``rollout_versions``; :func:`agent_batch_metrics` gives a step's ``agent/*``
metrics from its rows' ``agent_metrics`` column.

Shapes: n rows per group, P prompt width (left-padded), R = ``response_length``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from hybrid_rl.agents.loop import END_REASONS, FAILURE_KINDS, Trajectory
from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core import generation
from hybrid_rl.workers.rollout.multi_turn import _object_column, build_trajectory_output
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.sequences import build_rollout_output, prompt_token_lists

__all__ = ["StreamGroup", "agent_batch_metrics", "assemble_group", "group_requests", "split_groups"]


@dataclass
class StreamGroup:
    """One prompt's rows on their way through the engine."""

    batch: int
    """Index (1-based) of the prompt batch the group was drawn in."""
    position: int
    """The group's position in that batch (0-based)."""
    gen: DataProto
    """The n rows' prompt tensors ``input_ids`` / ``attention_mask`` / ``position_ids`` [n, P] (+ non-tensors)."""
    rest: DataProto
    """The n rows' other columns (``uid``, ``data_source``, ``reward_model``, ...)."""
    samples: dict[int, dict] = field(default_factory=dict)
    """Finished samples by row (0..n-1)."""

    @property
    def key(self) -> tuple[int, int]:
        return self.batch, self.position

    @property
    def complete(self) -> bool:
        return len(self.samples) == len(self.gen)


def split_groups(prepared: DataProto, n: int, batch: int) -> list[StreamGroup]:
    """The groups of a prepared batch (``prepare_rollout_batch``: [B * n] rows, a prompt's n copies
    adjacent); the prompt tensors go to ``gen``, the rest stays in ``rest``."""
    gen, rest = generation.split_generation_inputs(prepared)
    groups = []
    for position in range(len(prepared) // n):
        rows = np.arange(position * n, (position + 1) * n)
        groups.append(StreamGroup(batch, position, gen.select_idxs(rows), rest.select_idxs(rows)))
    return groups


def request_id(batch: int, position: int, row: int) -> str:
    """The engine request id of row ``row`` of group ``position`` of batch ``batch``."""
    return f"{batch}:{position}:{row}"


def parse_request_id(rid: str) -> tuple[int, int, int]:
    """``(batch, position, row)`` of a :func:`request_id`."""
    batch, position, row = (int(part) for part in rid.split(":"))
    return batch, position, row


def group_requests(group: StreamGroup, max_tokens: int, agent_rows: bool = False) -> list[dict[str, Any]]:
    """One stream request per row of ``group``: its unpadded prompt ids and the response budget;
    ``agent_rows``: the rows run through agent loops, and ``meta["row"]`` carries each row's non-tensor
    columns (``raw_prompt``, ``extra_info``, ``agent_name`` ...), as an agent loop's ``run`` receives them."""
    prompts = prompt_token_lists(group.gen.batch["input_ids"], group.gen.batch["attention_mask"])
    columns = group.gen.non_tensor_batch if agent_rows else {}
    return [{"request_id": request_id(group.batch, group.position, row), "prompt_ids": ids, "max_tokens": max_tokens,
             "meta": {"row": {k: v[row] for k, v in columns.items()}} if agent_rows else {}}
            for row, ids in enumerate(prompts)]


def assemble_group(group: StreamGroup, params: GenerationParams, with_log_probs: bool) -> DataProto:
    """The group's rollout batch, as the batch path builds it (responses cut at EOS, right-padded to R),
    plus ``rollout_versions`` [n, R] int64: the policy version that sampled each response token (-1 on
    padding). Raises if a sample is missing."""
    rows = range(len(group.gen))
    samples = [group.samples[row] for row in rows]
    if any("trajectory" in (s.get("meta") or {}) for s in samples):
        return _assemble_agent_group(group, samples, params, with_log_probs)
    output = build_rollout_output(group.gen, [s["response_ids"] for s in samples], params,
                                  [s["log_probs"] for s in samples] if with_log_probs else None)
    mask = output.batch["response_mask"]  # [n, R]
    versions = torch.full(mask.shape, -1, dtype=torch.int64)  # [n, R]
    for row, sample in enumerate(samples):
        kept = int(mask[row].sum())
        versions[row, :kept] = torch.as_tensor(list(sample["versions"])[:kept], dtype=torch.int64)
    output.batch["rollout_versions"] = versions
    rest = DataProto(batch=group.rest.batch, non_tensor_batch=dict(group.rest.non_tensor_batch),
                     meta_info=dict(group.rest.meta_info))
    return generation.merge_generation_output(rest, output)


def _assemble_agent_group(group: StreamGroup, samples: list[dict], params: GenerationParams,
                          with_log_probs: bool) -> DataProto:
    """A group of agent rows (``agent_stream.py``), in the batch path's trajectory layout
    (``build_trajectory_output``: observations in ``responses`` with mask 0, prompts left-padded to the
    engine's ``prompt_width``) plus ``rollout_versions`` [n, R] (-1 on observations and padding) and the
    rows' ``num_turns`` / ``tool_rewards`` / ``turn_scores`` / ``agent_metrics`` / ``reward_score``."""
    trajs = []
    for sample in samples:
        info = sample["meta"]["trajectory"]
        traj = Trajectory(prompt_ids=list(sample["prompt_ids"]), response_ids=list(sample["response_ids"]),
                          response_mask=list(info["response_mask"]), log_probs=list(sample["log_probs"]),
                          tool_rewards=list(info["tool_rewards"]), turn_scores=list(info["turn_scores"]),
                          end_reason=sample["finish_reason"], reward_score=info["reward_score"],
                          failure=info.get("failure", ""))
        trajs.append(traj)
    width = max(s["meta"]["trajectory"]["prompt_width"] for s in samples)
    output = build_trajectory_output(group.gen, trajs, params, with_log_probs, prompt_width=width)
    # the engine counted turns and metrics from the whole trajectory; the rebuilt one lacks the turn counts
    for key in ("num_turns", "agent_metrics"):
        output.non_tensor_batch[key] = _object_column([s["meta"]["trajectory"][key] for s in samples])
    versions = torch.full(output.batch["response_mask"].shape, -1, dtype=torch.int64)  # [n, R]
    for row, sample in enumerate(samples):
        versions[row, :len(sample["versions"])] = torch.as_tensor(sample["versions"], dtype=torch.int64)
    output.batch["rollout_versions"] = versions
    rest = DataProto(batch=group.rest.batch, non_tensor_batch=dict(group.rest.non_tensor_batch),
                     meta_info=dict(group.rest.meta_info))
    return generation.merge_generation_output(rest, output)


_MEAN_KEYS = ("num_turns", "assistant_turns", "tool_calls", "tool_errors", "tool_timeouts")


def agent_batch_metrics(rows: Sequence[Optional[dict]]) -> dict[str, float]:
    """The batch path's ``agent/*`` metrics (``multi_turn.batch_metrics``) from the rows' ``agent_metrics``
    column (``Trajectory.metrics()`` plus one ``ended_by/<reason>`` indicator per row), so a streamed step
    reports them over exactly the rows it trains: per-row means, the observation-token fraction (a ratio of
    sums, not a mean of ratios), ``tool/*`` and ``loop/*`` means (a row without the key counts 0), the
    share of rows per end reason. Rows without the column (``None``) are skipped; none: ``{}``."""
    rows = [r for r in rows if isinstance(r, dict)]
    if not rows:
        return {}
    out = {f"agent/{key}/mean": float(np.mean([r.get(key, 0.0) for r in rows])) for key in _MEAN_KEYS}
    obs = sum(r.get("observation_tokens", 0.0) for r in rows)
    model = sum(r.get("model_tokens", 0.0) for r in rows)
    out["agent/observation_token_fraction"] = obs / max(obs + model, 1.0)
    for key in sorted({k for r in rows for k in r if k.startswith(("tool/", "loop/"))}):
        out[f"agent/{key}"] = float(np.mean([r.get(key, 0.0) for r in rows]))
    # the indicators are 0/1, so their sum is the count the batch path divides by the row count
    out.update({f"agent/ended_by/{reason}": sum(float(r.get(f"ended_by/{reason}", 0.0)) for r in rows) / len(rows)
                for reason in END_REASONS})
    out.update({f"agent/failure/{kind}": sum(float(r.get(f"failure/{kind}", 0.0)) for r in rows) / len(rows)
                for kind in FAILURE_KINDS})
    return out
