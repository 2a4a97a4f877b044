"""The batch schema: every DataProto key, its dtype, shape and the step that produces it.

This module is the source of truth for key names (docs/architecture.md mirrors :data:`BATCH_SCHEMA`).
Shapes use B = rows (prompts x n after repeat), P = prompt length (left-padded), R = response length
(right-padded), L = P + R. Code should spell keys exactly as listed here; :func:`check_batch` lets a
step state which keys it needs and fails with the name of the step that should have produced a
missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hybrid_rl.protocol import DataProto

__all__ = ["BATCH_SCHEMA", "BatchKey", "SCHEMA_BY_NAME", "check_batch", "keys_produced_by"]

Part = Literal["batch", "non_tensor_batch", "meta_info"]


@dataclass(frozen=True)
class BatchKey:
    """One entry of the schema."""

    name: str
    """Key as spelled in the DataProto."""
    part: Part
    """Where it lives: ``batch`` (tensor), ``non_tensor_batch`` (numpy array) or ``meta_info``."""
    dtype: str
    """torch/numpy dtype (``object`` for numpy object arrays) or Python type for meta_info."""
    shape: str
    """Shape in terms of B, P, R, L; ``-`` for meta_info scalars."""
    produced_by: str
    """The step (or component) that adds the key to the batch."""
    doc: str
    """What the value means."""


_T, _N, _M = "batch", "non_tensor_batch", "meta_info"

BATCH_SCHEMA: tuple[BatchKey, ...] = (
    # ---- tensors
    BatchKey("input_ids", _T, "int64", "[B, P] prompt batch; [B, L] after rollout",
             "dataset collate (left-padded prompt); rollout (prompt ‖ response)", "token ids"),
    BatchKey("attention_mask", _T, "int64", "[B, P] prompt batch; [B, L] after rollout",
             "dataset collate; rollout", "1 for real tokens, 0 for padding"),
    BatchKey("position_ids", _T, "int64", "[B, P] prompt batch; [B, L] after rollout",
             "dataset collate; rollout", "positions counted over real tokens only"),
    BatchKey("prompts", _T, "int64", "[B, P]", "rollout", "the left-padded prompt ids the responses continue"),
    BatchKey("responses", _T, "int64", "[B, R]", "rollout", "generated ids, pad after EOS"),
    BatchKey("response_mask", _T, "int64/float", "[B, R]", "rollout",
             "1 for generated tokens up to and including EOS, 0 after; multi-turn: also 0 on tool and "
             "interaction observations (attention_mask stays 1 there)"),
    BatchKey("rollout_log_probs", _T, "float32", "[B, R]", "rollout (optional)",
             "log-probs of the sampled tokens under the rollout engine"),
    BatchKey("old_log_probs", _T, "float32", "[B, R]", "actor compute_log_prob",
             "log-probs of the responses under the actor before the update"),
    BatchKey("entropys", _T, "float32", "[B, R]", "actor compute_log_prob", "per-token policy entropy"),
    BatchKey("ref_log_prob", _T, "float32", "[B, R]", "ref compute_ref_log_prob",
             "log-probs under the frozen reference policy"),
    BatchKey("values", _T, "float32", "[B, R]", "critic compute_values", "value estimates per response token"),
    BatchKey("token_level_scores", _T, "float32", "[B, R]", "reward manager",
             "score at the last valid response token, zeros elsewhere"),
    BatchKey("token_level_rewards", _T, "float32", "[B, R]", "driver",
             "token_level_scores - beta * KL if use_kl_in_reward, else the scores"),
    BatchKey("advantages", _T, "float32", "[B, R]", "driver compute_advantage", "advantage per response token"),
    BatchKey("returns", _T, "float32", "[B, R]", "driver compute_advantage", "return targets for the critic"),
    BatchKey("reward_baselines", _T, "float32", "[B]", "driver (ReMax greedy baseline)",
             "reward of the greedy response, used by the remax estimator"),
    # ---- non-tensors (numpy object arrays of length B)
    BatchKey("uid", _N, "object", "[B]", "driver (before repeat)", "prompt group id shared by the n responses"),
    BatchKey("data_source", _N, "object", "[B]", "dataset collate", "selects the reward function"),
    BatchKey("reward_model", _N, "object", "[B]", "dataset collate", "dict with 'ground_truth' (and 'style')"),
    BatchKey("extra_info", _N, "object", "[B]", "dataset collate", "free-form per-row dict from the dataset"),
    BatchKey("raw_prompt", _N, "object", "[B]", "dataset collate", "chat messages of the prompt"),
    BatchKey("index", _N, "object", "[B]", "dataset collate", "row index within the dataset"),
    BatchKey("agent_name", _N, "object", "[B]", "dataset collate (optional column)",
             "multi-turn: single_turn_agent = one model turn; anything else runs the tool loop"),
    BatchKey("num_turns", _N, "object", "[B]", "rollout (multi-turn)",
             "int: user + assistant + observation turns (veRL's count, the prompt turn included)"),
    BatchKey("tool_rewards", _N, "object", "[B]", "rollout (multi-turn)",
             "list[float]: step rewards of the row's tool calls, then each tool instance's calc_reward"),
    BatchKey("turn_scores", _N, "object", "[B]", "rollout (multi-turn)",
             "list[float]: scores the row's interaction gave its turns"),
    BatchKey("policy_version", _N, "object", "[B]", "experience buffer (batch_from_experiences)",
             "int: version of the policy weights that sampled the row"),
    BatchKey("agent_metrics", _N, "object", "[B]", "rollout (multi-turn)",
             "dict[str, float]: per-row turns, tool calls/errors/timeouts, token counts, tool/<name>/<metric>, "
             "ended_by/<reason>"),
    # ---- meta_info
    BatchKey("eos_token_id", _M, "int | list[int]", "-", "driver / rollout config", "stop token id(s)"),
    BatchKey("pad_token_id", _M, "int", "-", "driver / rollout config", "padding token id"),
    BatchKey("do_sample", _M, "bool", "-", "driver", "sample (True) or greedy decode (False)"),
    BatchKey("validate", _M, "bool", "-", "driver", "True for validation generation"),
    BatchKey("temperature", _M, "float", "-", "driver / rollout config", "sampling temperature"),
    BatchKey("global_steps", _M, "int", "-", "driver", "training step counter"),
    BatchKey("metrics", _M, "dict[str, list]", "-", "workers (merged by DataProto.concat)",
             "per-worker metric dicts, merged into name -> list of values"),
)

SCHEMA_BY_NAME: dict[str, BatchKey] = {key.name: key for key in BATCH_SCHEMA}
assert len(SCHEMA_BY_NAME) == len(BATCH_SCHEMA), "duplicate name in BATCH_SCHEMA"


def keys_produced_by(step: str) -> list[str]:
    """Names whose ``produced_by`` mentions ``step`` (e.g. ``"compute_advantage"``)."""
    return [key.name for key in BATCH_SCHEMA if step in key.produced_by]


def check_batch(data: DataProto, required: list[str]) -> None:
    """Raise ValueError unless every name in ``required`` is present in its schema part of ``data``.

    A name that is not in the schema is an error too: it catches typos and second spellings.
    """
    if isinstance(required, str):
        raise ValueError(f"required must be a list of key names, got the string {required!r}")
    parts = {
        "batch": set(data.batch.keys()) if data.batch is not None else set(),
        "non_tensor_batch": set(data.non_tensor_batch),
        "meta_info": set(data.meta_info),
    }
    for name in required:
        key = SCHEMA_BY_NAME.get(name)
        if key is None:
            raise ValueError(f"{name!r} is not a key of the batch schema (hybrid_rl/schema.py); "
                             f"known keys: {sorted(SCHEMA_BY_NAME)}")
        if name not in parts[key.part]:
            elsewhere = [p for p, names in parts.items() if name in names]
            hint = f" (found in {elsewhere[0]} instead)" if elsewhere else ""
            raise ValueError(f"batch is missing {key.part}[{name!r}]{hint}; it is produced by: {key.produced_by}. "
                             f"Run that step before this one")
