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


def _last_model_token(mask: torch.Tensor) -> Optional[int]:
    """Index of the last 1 of a response mask row [R]; None when there is none."""
    model_tokens = mask.nonzero()
    return int(model_tokens[-1]) if len(model_tokens) else None


def _compact_scores(mask: torch.Tensor, reward: float) -> torch.Tensor:
    """[R] float32: ``reward`` on the last model token of ``mask`` [R], zeros elsewhere."""
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    last = _last_model_token(mask)
    if last is not None:
        scores[last] = reward
    return scores


def _token_rewards(scores: torch.Tensor, mask: torch.Tensor, reward: float) -> Optional[list[float]]:
    """A row's scores [valid] as Python floats, or None when the compact form rebuilds them bit for bit."""
    compact = _compact_scores(mask, reward)
    same = torch.equal(compact.view(torch.int32), scores.to(torch.float32).view(torch.int32))  # -0.0, NaN
    return None if same else scores.tolist()


def _token_versions(versions: torch.Tensor, mask: torch.Tensor, row: int,
                    default: int) -> tuple[int, Optional[list[int]]]:
    """(policy_version, token_versions) of a row's ``rollout_versions`` [valid]: the oldest version
    over its model tokens, and the list unless every model token has it and every observation -1."""
    model = versions[mask.bool()]
    if (model < 0).any():
        raise ValueError(f"rollout_versions row {row}: a model token (response_mask 1) carries version "
                         f"{int(model.min())}. Fix: tag each sampled token with the policy version that sampled it "
                         "(>= 0); -1 belongs on observations and padding only.")
    version = int(model.min()) if len(model) else int(default)
    compact = torch.where(mask.bool(), version, -1)
    return version, None if torch.equal(compact, versions.long()) else [int(v) for v in versions.tolist()]


def experiences_from_batch(batch: DataProto, tokenizer: Any, policy_version: int) -> list[Experience]:
    """One experience per row of a scored rollout batch (``prompts``, ``responses``, ``response_mask``,
    ``attention_mask`` [B, P+R], and ``token_level_scores`` or ``token_level_rewards`` [B, R]).
    With ``rollout_versions`` [B, R] (partial rollout) a row's ``policy_version`` is the oldest
    version over its model tokens; without, ``policy_version``."""
    t = batch.batch
    width = t["prompts"].shape[1]
    scores = t["token_level_scores"] if "token_level_scores" in t.keys() else t["token_level_rewards"]
    rewards = scores.sum(-1).tolist()  # [B]
    has_lp = "rollout_log_probs" in t.keys()
    versions = t["rollout_versions"] if "rollout_versions" in t.keys() else None  # [B, R] or None
    nt = batch.non_tensor_batch
    out = []
    for i in range(len(batch)):
        prompt = t["prompts"][i][t["attention_mask"][i, :width].bool()].tolist()
        valid = int(t["attention_mask"][i, width:].sum())  # response tokens, observations included
        response = t["responses"][i, :valid].tolist()
        mask = t["response_mask"][i, :valid]  # [valid]
        version, token_versions = int(policy_version), None
        if versions is not None:
            version, token_versions = _token_versions(versions[i, :valid], mask, i, policy_version)
        reward_model = nt["reward_model"][i] if "reward_model" in nt else None
        extra = {k: _jsonable(v[i]) for k, v in nt.items() if k not in _SKIPPED_COLUMNS}
        out.append(Experience(
            uid=str(nt["uid"][i]) if "uid" in nt else str(i),
            data_source=str(nt["data_source"][i]) if "data_source" in nt else "",
            prompt_ids=prompt, response_ids=response,
            response_mask=[int(x) for x in mask.tolist()],
            reward=float(rewards[i]), policy_version=version,
            rollout_log_probs=t["rollout_log_probs"][i, :valid].tolist() if has_lp else None,
            token_rewards=_token_rewards(scores[i, :valid], mask, float(rewards[i])),
            token_versions=token_versions,
            prompt_text=tokenizer.decode(prompt, skip_special_tokens=False),
            response_text=tokenizer.decode(response, skip_special_tokens=True),
            ground_truth=_jsonable(reward_model.get("ground_truth")) if isinstance(reward_model, dict) else None,
            extra=extra))
    return out


def _row_versions(e: Experience, mask: torch.Tensor) -> torch.Tensor:
    """[R] int64: the version that sampled each response token of ``e`` (``mask`` [R]), -1 on
    observations and padding."""
    if e.token_versions is None:
        return torch.where(mask.bool(), e.policy_version, -1)
    versions = torch.full(mask.shape, -1, dtype=torch.long)
    versions[:len(e.token_versions)] = torch.as_tensor(e.token_versions, dtype=torch.long)
    return versions


def _version_columns(experiences: Sequence[Experience], masks: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """``rollout_versions`` [B, R] and each row's (min, max) version over its model tokens (its
    ``policy_version`` when it has none)."""
    versions = torch.stack([_row_versions(e, m) for e, m in zip(experiences, masks)])  # [B, R]
    low, high = [], []
    for e, row, mask in zip(experiences, versions, masks):
        model = row[mask.bool()]
        low.append(int(model.min()) if len(model) else e.policy_version)
        high.append(int(model.max()) if len(model) else e.policy_version)
    return versions, low, high


def _scores(experiences: Sequence[Experience], masks: torch.Tensor) -> torch.Tensor:
    """``token_level_scores`` [B, R]: each row's ``token_rewards``, else its reward on its last model token."""
    scores = torch.zeros(masks.shape, dtype=torch.float32)  # [B, R]
    for i, e in enumerate(experiences):
        if e.token_rewards is not None:
            scores[i, :len(e.token_rewards)] = torch.as_tensor(e.token_rewards, dtype=torch.float32)
        else:
            scores[i] = _compact_scores(masks[i], e.reward)
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
