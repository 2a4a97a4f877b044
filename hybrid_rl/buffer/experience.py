"""One experience (a scored rollout row) and its conversion from and to the rollout batch.

An :class:`Experience` is what the decoupled mode's rollout side writes and its trainer side reads:
the exact token ids (prompt unpadded; response with observation tokens kept and marked 0 in
``response_mask``), the rollout's log-probs, the row's scalar reward, the policy version that
sampled it, and readable text. ``batch_from_experiences(experiences_from_batch(b, ...))`` gives back
the tensors of ``b`` (left-padded prompts, right-padded responses, the schema's key names).
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

__all__ = ["Experience", "batch_from_experiences", "experiences_from_batch"]

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


_SKIPPED_COLUMNS = ("uid", "data_source", "reward_model", "raw_prompt")


def experiences_from_batch(batch: DataProto, tokenizer: Any, policy_version: int) -> list[Experience]:
    """One experience per row of a scored rollout batch (``prompts``, ``responses``, ``response_mask``,
    ``attention_mask`` [B, P+R], and ``token_level_scores`` or ``token_level_rewards`` [B, R])."""
    t = batch.batch
    width = t["prompts"].shape[1]
    scores = t["token_level_scores"] if "token_level_scores" in t.keys() else t["token_level_rewards"]
    rewards = scores.sum(-1).tolist()  # [B]
    has_lp = "rollout_log_probs" in t.keys()
    nt = batch.non_tensor_batch
    out = []
    for i in range(len(batch)):
        prompt = t["prompts"][i][t["attention_mask"][i, :width].bool()].tolist()
        valid = int(t["attention_mask"][i, width:].sum())  # response tokens, observations included
        response = t["responses"][i, :valid].tolist()
        reward_model = nt["reward_model"][i] if "reward_model" in nt else None
        extra = {k: _jsonable(v[i]) for k, v in nt.items() if k not in _SKIPPED_COLUMNS}
        out.append(Experience(
            uid=str(nt["uid"][i]) if "uid" in nt else str(i),
            data_source=str(nt["data_source"][i]) if "data_source" in nt else "",
            prompt_ids=prompt, response_ids=response,
            response_mask=[int(x) for x in t["response_mask"][i, :valid].tolist()],
            reward=float(rewards[i]), policy_version=int(policy_version),
            rollout_log_probs=t["rollout_log_probs"][i, :valid].tolist() if has_lp else None,
            prompt_text=tokenizer.decode(prompt, skip_special_tokens=False),
            response_text=tokenizer.decode(response, skip_special_tokens=True),
            ground_truth=_jsonable(reward_model.get("ground_truth")) if isinstance(reward_model, dict) else None,
            extra=extra))
    return out


def batch_from_experiences(experiences: Sequence[Experience], pad_token_id: int, response_length: int,
                           prompt_length: Optional[int] = None) -> DataProto:
    """The rollout batch of ``experiences``: prompts left-padded to ``prompt_length`` (default: the
    longest), responses right-padded to ``response_length``; ``token_level_scores`` holds each reward
    on its last model token; non-tensor ``uid``, ``data_source``, ``reward_model``, ``policy_version``,
    plus every ``extra`` column all the experiences have (``extra_info``, ``num_turns``, ...)."""
    longest = max(len(e.prompt_ids) for e in experiences)
    if prompt_length is not None and prompt_length < longest:
        raise ValueError(f"a prompt of {longest} tokens does not fit prompt_length={prompt_length}. Fix: read "
                         "the experiences back with the max_prompt_length they were generated with.")
    for e in experiences:
        if len(e.response_ids) > response_length:
            raise ValueError(f"experience {e.id}: {len(e.response_ids)} response tokens > response_length="
                             f"{response_length}. Fix: read it back with the response_length it was generated with.")
    tensors = prompt_response_tensors([e.prompt_ids for e in experiences], [e.response_ids for e in experiences],
                                      [e.response_mask for e in experiences], pad_token_id,
                                      prompt_width=prompt_length, response_width=response_length)
    log_probs = torch.zeros((len(experiences), response_length), dtype=torch.float32)  # [B, R]
    scores = torch.zeros((len(experiences), response_length), dtype=torch.float32)
    for i, e in enumerate(experiences):
        if e.rollout_log_probs is not None:
            log_probs[i, :len(e.rollout_log_probs)] = torch.as_tensor(e.rollout_log_probs, dtype=torch.float32)
        model_tokens = tensors["response_mask"][i].nonzero()
        if len(model_tokens):
            scores[i, int(model_tokens[-1])] = e.reward
    tensors["token_level_scores"] = scores
    if all(e.rollout_log_probs is not None for e in experiences):
        tensors["rollout_log_probs"] = log_probs
    non_tensors = {"uid": to_object_array([e.uid for e in experiences]),
                   "data_source": to_object_array([e.data_source for e in experiences]),
                   "reward_model": to_object_array([{"ground_truth": e.ground_truth} for e in experiences]),
                   "policy_version": to_object_array([e.policy_version for e in experiences])}
    shared = set.intersection(*(set(e.extra) for e in experiences)) - set(non_tensors)
    for key in sorted(shared):
        non_tensors[key] = to_object_array([e.extra[key] for e in experiences])
    return DataProto.from_dict(tensors, non_tensors=non_tensors)
