"""One experience (a scored rollout row) and its conversion from and to the rollout batch.

An :class:`Experience` is what the decoupled mode's rollout side writes and its trainer side reads:
the exact token ids (prompt unpadded; response with observation tokens kept and marked 0 in
``response_mask``), the rollout's log-probs, the row's scalar reward, the policy version that
sampled it, and readable text. ``batch_from_experiences(experiences_from_batch(b, ...))`` gives back
the tensors of ``b`` (left-padded prompts, right-padded responses, the schema's key names).

Per-token rewards and versions are stored only where the scalar cannot rebuild them (compact rule):
``token_rewards`` when the row's ``token_level_scores`` are not "the reward on the last model token,
zeros elsewhere" (multi-turn turn-end scores, tool rewards), ``token_versions`` when the tokens were
not all sampled by ``policy_version`` (partial rollout). A row's ``policy_version`` is then the
oldest version over its model tokens (its first token's), so staleness = trainer version - that.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch

from hybrid_rl.data.layout import prompt_response_tensors
from hybrid_rl.protocol import DataProto
from hybrid_rl.protocol_utils import to_object_array

__all__ = ["Experience", "batch_from_experiences", "check_experience", "experiences_from_batch"]

STATUSES = ("ready", "taken", "dropped")
"""ready = not trained on yet; taken = handed to the trainer at ``taken_step``; dropped = too stale."""


@dataclass
class Experience:
    """One rollout row (one trajectory), as stored in an experience buffer."""

    uid: str
    """Prompt group id shared by the n responses of one prompt (GRPO groups)."""
    data_source: str
    """The row's data source (selects the reward function)."""
    prompt_ids: list[int]
    """Prompt token ids, unpadded."""
    response_ids: list[int]
    """Response token ids (model turns and observations), unpadded."""
    response_mask: list[int]
    """Per response token: 1 = sampled by the model, 0 = observation (tool result, user reply)."""
    reward: float
    """The row's scalar reward (the sum of its ``token_level_scores``)."""
    policy_version: int
    """Version of the policy weights that sampled the response (the trainer's step when synced)."""
    rollout_log_probs: Optional[list[float]] = None
    """Per response token: the sampling engine's log-prob (0 on observations); None if not recorded."""
    token_rewards: Optional[list[float]] = None
    """Per response token: the row's ``token_level_scores`` exactly (float32 values); None = the
    ``reward`` on the last model token, zeros elsewhere (the single-turn case)."""
    token_versions: Optional[list[int]] = None
    """Per response token: the policy version that sampled it, -1 on observations (partial rollout);
    None = every model token sampled by ``policy_version``."""
    prompt_text: str = ""
    """Decoded prompt (special tokens kept, as the model saw it)."""
    response_text: str = ""
    """Decoded response (special tokens dropped)."""
    ground_truth: Any = None
    """``reward_model.ground_truth`` of the row (JSON-serialisable)."""
    extra: dict = field(default_factory=dict)
    """JSON-serialisable non-tensor columns of the row (e.g. ``extra_info``, ``num_turns``)."""
    created_at: float = field(default_factory=time.time)
    """Unix time the experience was written."""
    status: str = "ready"
    """ready | taken | dropped (see STATUSES)."""
    taken_step: Optional[int] = None
    """Trainer step that took it (status taken)."""
    id: Optional[int] = None
    """Assigned by the buffer on ``put`` (insertion order)."""

    def to_dict(self) -> dict:
        return asdict(self)


def _jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays made Python numbers/lists (recursively), so JSON can store
    it; anything else JSON cannot hold becomes its ``repr``."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


_SKIPPED_COLUMNS = ("uid", "data_source", "reward_model", "raw_prompt", "min_global_steps", "max_global_steps")
"""Non-tensor columns kept in their own fields, or derived from them on the way back."""


def check_experience(e: Experience) -> None:
    """A ``ValueError`` of one line naming the row when a per-token list is not as long as its
    ``response_ids``."""
    for name in ("token_rewards", "token_versions"):
        values = getattr(e, name)
        if values is not None and len(values) != len(e.response_ids):
            row = f"experience {e.id}" if e.id is not None else "an experience not yet stored"
            raise ValueError(f"{row} (uid {e.uid!r}): {name} has {len(values)} values for "
                             f"{len(e.response_ids)} response tokens. Fix: give one value per response_ids "
                             f"token (observations included), or None.")


def _compact_scores(masks: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """[B, R] float32: each row's reward (``rewards`` [B]) on the last model token of ``masks`` [B, R],
    zeros elsewhere (and all zeros in a row without model tokens)."""
    model = masks.bool()
    last = masks.shape[-1] - 1 - model.flip(-1).int().argmax(-1)  # [B]: argmax gives the first maximum
    rows = model.any(-1).nonzero().squeeze(-1)
    scores = torch.zeros(masks.shape, dtype=torch.float32)
    scores[rows, last[rows]] = rewards.to(torch.float32)[rows]
    return scores


def _needs_token_rewards(scores: torch.Tensor, model: torch.Tensor, in_valid: torch.Tensor,
                         rewards: torch.Tensor) -> torch.Tensor:
    """[B] bool: the rows whose scores [B, R] over their response tokens (``in_valid``) the compact
    form (reward on the last model token) does not rebuild bit for bit (-0.0 and NaN payloads too)."""
    compact = _compact_scores(model, rewards)
    differ = compact.view(torch.int32) != scores.to(torch.float32).view(torch.int32)
    return (differ & in_valid).any(-1)


def _oldest_versions(versions: torch.Tensor, model: torch.Tensor, in_valid: torch.Tensor,
                     default: int) -> tuple[list[int], torch.Tensor]:
    """Each row's oldest version over its model tokens (``default`` where it has none) and [B] bool:
    the rows whose ``rollout_versions`` [B, R] that version and -1 on observations do not rebuild."""
    bad = (versions < 0) & model
    if bad.any():
        row = int(bad.any(-1).nonzero()[0])
        raise ValueError(f"rollout_versions row {row}: a model token (response_mask 1) carries version "
                         f"{int(versions[row][bad[row]].min())}. Fix: tag each sampled token with the policy version "
                         "that sampled it (>= 0); -1 belongs on observations and padding only.")
    oldest = torch.where(model, versions, torch.iinfo(torch.long).max).min(-1).values  # [B]
    oldest = torch.where(model.any(-1), oldest, int(default))
    compact = torch.where(model, oldest[:, None], -1)  # [B, R]
    return oldest.tolist(), ((compact != versions) & in_valid).any(-1)


def experiences_from_batch(batch: DataProto, tokenizer: Any, policy_version: int) -> list[Experience]:
    """One experience per row of a scored rollout batch (``prompts``, ``responses``, ``response_mask``,
    ``attention_mask`` [B, P+R], and ``token_level_scores`` or ``token_level_rewards`` [B, R]).
    With ``rollout_versions`` [B, R] (partial rollout) a row's ``policy_version`` is the oldest
    version over its model tokens; without, ``policy_version``."""
    t = batch.batch
    width = t["prompts"].shape[1]
    scores = t["token_level_scores"] if "token_level_scores" in t.keys() else t["token_level_rewards"]
    reward_sums = scores.sum(-1)  # [B]
    rewards = reward_sums.tolist()
    has_lp = "rollout_log_probs" in t.keys()
    lengths = t["attention_mask"][:, width:].sum(-1)  # [B] response tokens, observations included
    in_valid = torch.arange(scores.shape[-1]) < lengths[:, None]  # [B, R]
    model = t["response_mask"].bool() & in_valid  # [B, R]
    needs_rewards = _needs_token_rewards(scores, model, in_valid, reward_sums).tolist()
    versions, needs_versions = [int(policy_version)] * len(batch), [False] * len(batch)
    if "rollout_versions" in t.keys():  # partial rollout
        versions, needs = _oldest_versions(t["rollout_versions"], model, in_valid, policy_version)
        needs_versions = needs.tolist()
    nt = batch.non_tensor_batch
    out = []
    for i in range(len(batch)):
        prompt = t["prompts"][i][t["attention_mask"][i, :width].bool()].tolist()
        valid = int(lengths[i])
        response = t["responses"][i, :valid].tolist()
        reward_model = nt["reward_model"][i] if "reward_model" in nt else None
        extra = {k: _jsonable(v[i]) for k, v in nt.items() if k not in _SKIPPED_COLUMNS}
        out.append(Experience(
            uid=str(nt["uid"][i]) if "uid" in nt else str(i),
            data_source=str(nt["data_source"][i]) if "data_source" in nt else "",
            prompt_ids=prompt, response_ids=response,
            response_mask=[int(x) for x in t["response_mask"][i, :valid].tolist()],
            reward=float(rewards[i]), policy_version=versions[i],
            rollout_log_probs=t["rollout_log_probs"][i, :valid].tolist() if has_lp else None,
            token_rewards=scores[i, :valid].tolist() if needs_rewards[i] else None,
            token_versions=t["rollout_versions"][i, :valid].tolist() if needs_versions[i] else None,
            prompt_text=tokenizer.decode(prompt, skip_special_tokens=False),
            response_text=tokenizer.decode(response, skip_special_tokens=True),
            ground_truth=_jsonable(reward_model.get("ground_truth")) if isinstance(reward_model, dict) else None,
            extra=extra))
    return out


def _version_columns(experiences: Sequence[Experience], masks: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """``rollout_versions`` [B, R] (each row's ``token_versions``, else its ``policy_version`` on model
    tokens; -1 on observations and padding) and each row's (min, max) version over its model tokens
    (its ``policy_version`` when it has none)."""
    model = masks.bool()  # [B, R]
    own = torch.tensor([e.policy_version for e in experiences], dtype=torch.long)  # [B]
    versions = torch.where(model, own[:, None], -1)  # [B, R]
    for i, e in enumerate(experiences):
        if e.token_versions is not None:
            versions[i] = -1
            versions[i, :len(e.token_versions)] = torch.as_tensor(e.token_versions, dtype=torch.long)
    big = torch.iinfo(torch.long).max
    low = torch.where(model.any(-1), torch.where(model, versions, big).min(-1).values, own)
    high = torch.where(model.any(-1), torch.where(model, versions, -big).max(-1).values, own)
    return versions, low.tolist(), high.tolist()


def _scores(experiences: Sequence[Experience], masks: torch.Tensor) -> torch.Tensor:
    """``token_level_scores`` [B, R]: each row's ``token_rewards``, else its reward on its last model token."""
    scores = _compact_scores(masks, torch.tensor([e.reward for e in experiences], dtype=torch.float32))  # [B, R]
    for i, e in enumerate(experiences):
        if e.token_rewards is not None:
            scores[i] = 0.0
            scores[i, :len(e.token_rewards)] = torch.as_tensor(e.token_rewards, dtype=torch.float32)
    return scores


def _check_fits(experiences: Sequence[Experience], response_length: int, prompt_length: Optional[int]) -> None:
    longest = max(len(e.prompt_ids) for e in experiences)
    if prompt_length is not None and prompt_length < longest:
        raise ValueError(f"a prompt of {longest} tokens does not fit prompt_length={prompt_length}. Fix: read "
                         "the experiences back with the max_prompt_length they were generated with.")
    for e in experiences:
        if len(e.response_ids) > response_length:
            raise ValueError(f"experience {e.id}: {len(e.response_ids)} response tokens > response_length="
                             f"{response_length}. Fix: read it back with the response_length it was generated with.")
        check_experience(e)


def batch_from_experiences(experiences: Sequence[Experience], pad_token_id: int, response_length: int,
                           prompt_length: Optional[int] = None) -> DataProto:
    """The rollout batch of ``experiences``: prompts left-padded to ``prompt_length`` (default: the
    longest), responses right-padded to ``response_length``; ``token_level_scores`` holds each row's
    ``token_rewards``, else its reward on its last model token; ``rollout_versions`` [B, R] when a row
    has ``token_versions``; non-tensor ``uid``, ``data_source``, ``reward_model``, ``policy_version``,
    ``min_global_steps`` / ``max_global_steps`` (the row's version span over its model tokens), plus
    every ``extra`` column all the experiences have (``extra_info``, ``num_turns``, ...)."""
    _check_fits(experiences, response_length, prompt_length)
    tensors = prompt_response_tensors([e.prompt_ids for e in experiences], [e.response_ids for e in experiences],
                                      [e.response_mask for e in experiences], pad_token_id,
                                      prompt_width=prompt_length, response_width=response_length)
    log_probs = torch.zeros((len(experiences), response_length), dtype=torch.float32)  # [B, R]
    for i, e in enumerate(experiences):
        if e.rollout_log_probs is not None:
            log_probs[i, :len(e.rollout_log_probs)] = torch.as_tensor(e.rollout_log_probs, dtype=torch.float32)
    tensors["token_level_scores"] = _scores(experiences, tensors["response_mask"])
    if all(e.rollout_log_probs is not None for e in experiences):
        tensors["rollout_log_probs"] = log_probs
    versions, low, high = _version_columns(experiences, tensors["response_mask"])
    if any(e.token_versions is not None for e in experiences):
        tensors["rollout_versions"] = versions
    non_tensors = {"uid": to_object_array([e.uid for e in experiences]),
                   "data_source": to_object_array([e.data_source for e in experiences]),
                   "reward_model": to_object_array([{"ground_truth": e.ground_truth} for e in experiences]),
                   "policy_version": to_object_array([e.policy_version for e in experiences]),
                   "min_global_steps": to_object_array(low), "max_global_steps": to_object_array(high)}
    shared = set.intersection(*(set(e.extra) for e in experiences)) - set(non_tensors)
    for key in sorted(shared):
        non_tensors[key] = to_object_array([e.extra[key] for e in experiences])
    return DataProto.from_dict(tensors, non_tensors=non_tensors)
