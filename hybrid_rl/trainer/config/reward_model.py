"""The checks of the ``reward_model`` section (a learned reward model in RL): a usable reward-model
folder (one-output sequence-classification head, normalisation statistics when asked for) or a
remote service's URL, and consistent weights."""

from __future__ import annotations

import json
import os
from typing import Optional

from hybrid_rl.trainer.config.schema import PPOConfig

__all__ = ["check_reward_model", "is_remote"]


def is_remote(path: Optional[str]) -> bool:
    """Whether ``reward_model.model.path`` names a remote reward service."""
    return bool(path) and str(path).startswith(("http://", "https://"))


_SEQUENCE_HEADS = ("ForSequenceClassification", "ForTokenClassification")


def _folder_problems(rm) -> list[str]:
    """Why ``reward_model.model.path`` is not a usable reward-model folder (empty when it is)."""
    path = os.path.expanduser(rm.model.path)
    key = "reward_model.model.path"
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        return [f"{key}={rm.model.path!r} is not a model folder (no config.json). Fix: point it at a reward model's "
                "HF folder (python -m hybrid_rl.model_merger on a main_rm checkpoint writes one) or an http(s):// "
                "reward service."]
    try:
        hf_config = json.load(open(config_file, encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"{key}={rm.model.path!r}: {config_file} is not readable JSON ({error})."]
    architectures = [str(a) for a in hf_config.get("architectures") or []]
    labels = len(hf_config.get("id2label") or {}) or 2  # PretrainedConfig defaults to two labels
    if not any(a.endswith(_SEQUENCE_HEADS) for a in architectures) or labels != 1:
        return [f"{key}={rm.model.path!r} holds {architectures or 'an unknown architecture'}, not a reward model (a "
                "one-output *ForSequenceClassification head). Fix: train one with python -m hybrid_rl.trainer.main_rm "
                "and export it with python -m hybrid_rl.model_merger, or use a TRL / OpenRLHF reward model."]
    if rm.normalize and not ("mean" in hf_config and "std" in hf_config):
        return [f"reward_model.normalize=true but {config_file} has no mean / std (main_rm writes them). Fix: set "
                "reward_model.normalize=null (normalise when present) or false."]
    return []


def check_reward_model(cfg: PPOConfig) -> list[str]:
    """One line per problem of the ``reward_model`` section (empty when it is usable)."""
    rm = cfg.reward_model
    if not rm.enable:
        return []
    errors = []
    if not rm.model.path:
        errors.append("reward_model.enable=true needs reward_model.model.path: a reward model's HF folder (python -m "
                      "hybrid_rl.trainer.main_rm trains one) or the http(s):// URL of a reward service.")
    elif not is_remote(rm.model.path):
        errors += _folder_problems(rm)
    if rm.rm_weight == 0 and rm.rule_weight == 0:
        errors.append("reward_model.rm_weight and rule_weight are both 0: every reward would be 0. Fix: set "
                      "reward_model.rm_weight=1.0 (or reward_model.enable=false for rules alone).")
    if not cfg.data.return_raw_chat:
        errors.append("reward_model.enable=true renders each prompt through the reward model's chat template and "
                      "needs the prompts' messages: set data.return_raw_chat=true.")
    return errors
