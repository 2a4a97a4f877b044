"""The batch schema: every DataProto key, its dtype, shape and the step that produces it.

This module is the source of truth for key names (docs/architecture.md mirrors :data:`BATCH_SCHEMA`;
``tests/test_schema_keys.py`` fails on a key the package reads or writes that is not listed here).
Shapes use B = rows (prompts x n after repeat; pairs for a preference batch), P = prompt length
(left-padded), R = response length (right-padded), L = P + R, K = top-K ids. A name ending in ``*``
is a family of keys with a dynamic suffix (``reward_extra_<name>``): :func:`lookup` matches its
prefix; every other name must be spelled exactly. :func:`check_batch` lets a step state which keys
it needs and fails with the name of the step that should have produced a missing one;
:func:`unknown_keys` lists the keys of a batch the schema does not know (a typo, a second spelling).
The steps' declarations over these keys are :mod:`hybrid_rl.trainer.core.batch_contract`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal, Optional

if TYPE_CHECKING:
    from hybrid_rl.protocol import DataProto

__all__ = ["BATCH_SCHEMA", "BatchKey", "PARTS", "SCHEMA_BY_NAME", "SCHEMA_PATTERNS", "check_batch",
           "keys_produced_by", "lookup", "unknown_keys"]

Part = Literal["batch", "non_tensor_batch", "meta_info"]
PARTS: tuple[Part, ...] = ("batch", "non_tensor_batch", "meta_info")


@dataclass(frozen=True)
class BatchKey:
    """One entry of the schema."""

    name: str
    """Key as spelled in the DataProto; a trailing ``*`` names a family (``reward_extra_*``)."""
    part: Part
    """Where it lives: ``batch`` (tensor), ``non_tensor_batch`` (numpy array) or ``meta_info``."""
    dtype: str
    """torch/numpy dtype (``object`` for numpy object arrays) or Python type for meta_info."""
    shape: str
    """Shape in terms of B, P, R, L, K; ``-`` for meta_info scalars."""
    produced_by: str
    """The step (or component) that adds the key to the batch."""
    doc: str
    """What the value means."""

    @property
    def is_pattern(self) -> bool:
        """Whether the entry names a family of keys (``prefix*``)."""
        return self.name.endswith("*")

    def matches(self, name: str) -> bool:
        """Whether ``name`` is this key (or one of its family)."""
        return name.startswith(self.name[:-1]) if self.is_pattern else name == self.name


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
    BatchKey("rollout_versions", _T, "int64", "[B, R]",
             "rollout (partial rollout); experience buffer (batch_from_experiences)",
             "policy version that sampled each response token, -1 on observations/padding; partial rollout"),
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
    BatchKey("rollout_is_weights", _T, "float32", "[B, R]", "driver compute_rollout_correction (optional)",
             "truncated importance weights pi_old / pi_rollout (algorithm.rollout_correction.rollout_is); absent "
             "when no weights are asked for or every token is masked"),
    BatchKey("rm_scores", _T, "float32", "[B, R]", "reward model compute_rm_score",
             "the learned reward model's score (normalised as trained) at the last valid response token; "
             "compute_reward pops it"),
    BatchKey("rm_raw_scores", _T, "float32", "[B]", "reward model compute_rm_score",
             "the reward model's score before normalisation; compute_reward pops it"),
    BatchKey("rm_input_ids", _T, "int64", "[B, L_rm]", "reward-model worker (its own chat template; optional input)",
             "prompt and decoded response re-tokenised for the reward model (right-padded)"),
    BatchKey("rm_attention_mask", _T, "int64", "[B, L_rm]", "reward-model worker (its own chat template; optional input)",
             "1 on the reward model's real tokens"),
    BatchKey("rm_position_ids", _T, "int64", "[B, L_rm]", "reward-model worker (its own chat template; optional input)",
             "positions of the reward model's tokens"),
    BatchKey("teacher_log_prob", _T, "float32", "[B, R]", "teacher compute_teacher_log_prob",
             "log-probs of the sampled tokens under each row's teacher (on-policy distillation)"),
    BatchKey("teacher_topk_log_probs", _T, "float32", "[B, R, K]", "teacher compute_teacher_log_prob (top-K loss)",
             "the teacher's K largest log-probs per response position"),
    BatchKey("teacher_topk_ids", _T, "int64", "[B, R, K]", "teacher compute_teacher_log_prob (top-K loss)",
             "the token ids of teacher_topk_log_probs"),
    # ---- preference pairs (reward-model training: one row per pair)
    BatchKey("chosen_input_ids", _T, "int64", "[B, L]", "preference dataset collate",
             "prompt and chosen response, right-padded"),
    BatchKey("chosen_attention_mask", _T, "int64", "[B, L]", "preference dataset collate", "1 on the chosen sequence's tokens"),
    BatchKey("chosen_position_ids", _T, "int64", "[B, L]", "preference dataset collate", "positions of the chosen sequence"),
    BatchKey("rejected_input_ids", _T, "int64", "[B, L]", "preference dataset collate",
             "prompt and rejected response, right-padded"),
    BatchKey("rejected_attention_mask", _T, "int64", "[B, L]", "preference dataset collate",
             "1 on the rejected sequence's tokens"),
    BatchKey("rejected_position_ids", _T, "int64", "[B, L]", "preference dataset collate",
             "positions of the rejected sequence"),
    BatchKey("margin", _T, "float32", "[B]", "preference dataset collate",
             "subtracted from each pair's score difference in the Bradley-Terry loss (0 = none)"),
    BatchKey("chosen_scores", _T, "float32", "[B]", "reward model compute_pair_scores", "score of each chosen sequence"),
    BatchKey("rejected_scores", _T, "float32", "[B]", "reward model compute_pair_scores",
             "score of each rejected sequence"),
    # ---- non-tensors (numpy object arrays of length B)
    BatchKey("uid", _N, "object", "[B]", "driver (before repeat)", "prompt group id shared by the n responses"),
    BatchKey("data_source", _N, "object", "[B]", "dataset collate", "selects the reward function"),
    BatchKey("reward_model", _N, "object", "[B]", "dataset collate", "dict with 'ground_truth' (and 'style')"),
    BatchKey("extra_info", _N, "object", "[B]", "dataset collate", "free-form per-row dict from the dataset"),
    BatchKey("raw_prompt", _N, "object", "[B]", "dataset collate", "chat messages of the prompt"),
    BatchKey("index", _N, "object", "[B]", "dataset collate", "row index within the dataset"),
    BatchKey("ability", _N, "object", "[B]", "dataset collate", "the row's task category (veRL's column)"),
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
    BatchKey("min_global_steps", _N, "object", "[B]", "experience buffer (batch_from_experiences)",
             "int: oldest policy version over the row's model tokens (= policy_version; veRL fully-async's name)"),
    BatchKey("max_global_steps", _N, "object", "[B]", "experience buffer (batch_from_experiences)",
             "int: newest policy version over the row's model tokens (> min_global_steps after a partial "
             "rollout; veRL fully-async's name)"),
    BatchKey("agent_metrics", _N, "object", "[B]", "rollout (multi-turn)",
             "dict[str, float]: per-row turns, tool calls/errors/timeouts, token counts, tool/<name>/<metric>, "
             "ended_by/<reason>"),
    BatchKey("agent_failure", _N, "object", "[B]", "rollout (multi-turn agent loop)",
             "str: why a custom agent loop's row failed (timeout, exception, bad_return); '' when it did not"),
    BatchKey("reward_score", _N, "object", "[B]", "rollout (multi-turn agent loop)",
             "float or None: the score an agent gave its own row; the reward manager keeps it"),
    BatchKey("rollout_row", _N, "object", "[B]", "driver generate (rollout.agent.rows=every_call)",
             "int: the input row (index in the generate call) a row came from; the rows of one rollout share it"),
    BatchKey("rollout_rows", _N, "object", "[B]", "rollout (multi-turn agent loop, agent.rows=every_call)",
             "int: k, how many rows the row's rollout gave (its advantage is shared by them, scaled by 1/k)"),
    BatchKey("rollout_batch", _N, "object", "[B]", "rollout producer (decoupled mode)",
             "int: the prompt batch a buffered row was generated from"),
    BatchKey("rollout_group", _N, "object", "[B]", "streaming producer (async_training.partial_rollout)",
             "int: the row's prompt group (0-based position in its prompt batch); with rollout_batch it names "
             "the group a resumed stream skips when it is already buffered"),
    BatchKey("reward_extra_*", _N, "object", "[B]", "compute_reward (a scorer's dict result)",
             "reward_extra_<name>: the scorer's value <name> per row (reward_extra_score: the score before "
             "the overlong penalty)"),
    # ---- meta_info
    BatchKey("eos_token_id", _M, "int | list[int]", "-", "driver / rollout config", "stop token id(s)"),
    BatchKey("pad_token_id", _M, "int", "-", "driver / rollout config", "padding token id"),
    BatchKey("do_sample", _M, "bool", "-", "driver", "sample (True) or greedy decode (False)"),
    BatchKey("validate", _M, "bool", "-", "driver", "True for validation generation"),
    BatchKey("temperature", _M, "float", "-", "driver / rollout config", "sampling temperature"),
    BatchKey("global_steps", _M, "int", "-", "driver", "training step counter"),
    BatchKey("seed", _M, "int", "-", "driver (generation_meta)", "the rollout engine's sampling seed of this call"),
    BatchKey("rollout_correction", _M, "dict", "-", "driver update_actor (bypass mode)",
             "algorithm.rollout_correction with the preset's keys filled in; the actor's loss corrects itself"),
    BatchKey("one_optimizer_step", _M, "bool", "-", "driver update_actor (online DPO; agent.rows=every_call)",
             "the actor takes one optimizer step per epoch over all its rows (a varying pair count)"),
    BatchKey("micro_batch_size", _M, "int", "-", "worker (log-prob call settings)", "rows per forward micro-batch"),
    BatchKey("use_dynamic_bsz", _M, "bool", "-", "worker (log-prob call settings)",
             "micro-batches by token budget instead of rows"),
    BatchKey("max_token_len", _M, "int", "-", "worker (log-prob call settings)", "token budget per micro-batch"),
    BatchKey("metrics", _M, "dict[str, list]", "-", "workers (merged by DataProto.concat)",
             "per-worker metric dicts, merged into name -> list of values"),
)

SCHEMA_BY_NAME: dict[str, BatchKey] = {key.name: key for key in BATCH_SCHEMA}
assert len(SCHEMA_BY_NAME) == len(BATCH_SCHEMA), "duplicate name in BATCH_SCHEMA"
SCHEMA_PATTERNS: tuple[BatchKey, ...] = tuple(key for key in BATCH_SCHEMA if key.is_pattern)
"""The families of keys (``reward_extra_*``)."""


def lookup(name: str) -> Optional[BatchKey]:
    """The schema entry of ``name``: its own, else the family whose prefix it has; None if unknown."""
    key = SCHEMA_BY_NAME.get(name)
    if key is not None and not key.is_pattern:
        return key
    return next((k for k in SCHEMA_PATTERNS if k.matches(name)), None)


def keys_produced_by(step: str) -> list[str]:
    """Names whose ``produced_by`` mentions ``step`` (e.g. ``"compute_advantage"``)."""
    return [key.name for key in BATCH_SCHEMA if step in key.produced_by]


def _present(data: DataProto) -> dict[str, set[str]]:
    return {
        "batch": set(data.batch.keys()) if data.batch is not None else set(),
        "non_tensor_batch": set(data.non_tensor_batch),
        "meta_info": set(data.meta_info),
    }


def check_batch(data: DataProto, required: Iterable[str], *, step: Optional[str] = None) -> None:
    """Raise ValueError unless every name in ``required`` is present in its schema part of ``data``.

    A name that is not in the schema is an error too: it catches typos and second spellings.
    ``step`` names the step the check is for in the message.
    """
    if isinstance(required, str):
        raise ValueError(f"required must be a list of key names, got the string {required!r}")
    parts = _present(data)
    where = f"step {step}: " if step else ""
    for name in required:
        key = lookup(name)
        if key is None:
            raise ValueError(f"{where}{name!r} is not a key of the batch schema (hybrid_rl/schema.py); "
                             f"known keys: {sorted(SCHEMA_BY_NAME)}")
        if name not in parts[key.part]:
            elsewhere = [p for p, names in parts.items() if name in names]
            hint = f" (found in {elsewhere[0]} instead)" if elsewhere else ""
            raise ValueError(f"{where}batch is missing {key.part}[{name!r}]{hint}; it is produced by: "
                             f"{key.produced_by}. Run that step before this one")


def unknown_keys(data: DataProto) -> list[str]:
    """``part['name']`` of every key of ``data`` the schema does not know, or knows in another part."""
    out = []
    for part, names in _present(data).items():
        for name in sorted(names):
            key = lookup(name)
            if key is None or key.part != part:
                out.append(f"{part}[{name!r}]")
    return out
