"""The reward-model worker: a scalar-head model trained and read as a reward model.

A reward model is the critic's layout (veRL's): the backbone with a one-output token-classification
head, here built without a bias (``token_classification_bias=False``) so its weights are exactly
``AutoModelForSequenceClassification``'s (``model.*`` + ``score.weight``). Its HF config names the
sequence-classification class, so a checkpoint merged by ``python -m hybrid_rl.model_merger``
loads with ``AutoModelForSequenceClassification`` (TRL, OpenRLHF) and, unchanged, with
``AutoModelForTokenClassification`` (veRL's reward-model worker). The score normalisation
statistics (OpenRLHF's ``config.mean`` / ``config.std``) are written into the same config.

Everything else (FSDP2 sharding, AdamW, LR schedule, optimizer offload, atomic checkpoints) is the
mode-neutral :class:`~hybrid_rl.workers.scalar_worker.ScalarModelWorker`'s, which the critic's worker
shares: the two are siblings, neither a subclass of the other.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import torch

from hybrid_rl.data.reward_data import rm_sequence_ids, sequence_tensors
from hybrid_rl.protocol import DataProto
from hybrid_rl.single_controller import Dispatch, register
from hybrid_rl.utils.memory import phase_peak
from hybrid_rl.workers.config import CriticConfig
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_tokenizer_path
from hybrid_rl.workers.reward_model import DataParallelRewardModel
from hybrid_rl.workers.scalar_worker import ScalarModelWorker

__all__ = ["RewardModelWorker", "sequence_classification_architecture"]


def sequence_classification_architecture(model_type: str) -> Optional[str]:
    """``LlamaForSequenceClassification`` for ``llama`` etc.; None when transformers has none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)


class RewardModelWorker(ScalarModelWorker):
    """One device's reward model: pairwise Bradley-Terry updates and scores.

    Args:
        config: a critic-shaped config (``main_rm`` builds one from its own keys, ``rm_critic_config``; RL from
            ``reward_model.*``); ``ppo_micro_batch_size_per_gpu`` counts pairs per micro-batch.
        total_training_steps: steps of the run, for the LR schedule.
        input_tokenizer: RL: folder of the policy's tokenizer, which decodes responses (None: the
            reward model's own).
        max_length: RL: most tokens of a rendered conversation (longer ones keep their end).
        normalize: RL: normalise scores with the config's ``mean`` / ``std`` (None: when present).
    """

    def __init__(self, config: CriticConfig, total_training_steps: Optional[int] = None, *,
                 input_tokenizer: Optional[str] = None, max_length: Optional[int] = None,
                 normalize: Optional[bool] = None):
        if isinstance(config, CriticConfig):
            override = {**config.model.override_config, "token_classification_bias": False}
            config = dataclasses.replace(config, model=dataclasses.replace(config.model, override_config=override))
        super().__init__(config, total_training_steps)
        self.input_tokenizer_path = input_tokenizer
        self.max_length = max_length
        self.normalize = normalize

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """The scalar model's set-up, then its reward-model view."""
        sizes = self.build_scalar_model()
        hf_config = self.module.config
        architecture = sequence_classification_architecture(hf_config.model_type)
        if architecture:
            hf_config.architectures = [architecture]
        if hf_config.pad_token_id is None:
            hf_config.pad_token_id = self.tokenizer.pad_token_id
        key = "reward_model.model.input_tokenizer"
        self.input_tokenizer = (load_tokenizer(resolve_tokenizer_path(self.input_tokenizer_path, key))
                                if self.input_tokenizer_path else self.tokenizer)
        model = self.config.model
        self.reward_model = DataParallelRewardModel(
            self.module, self.optimizer, micro_batch_pairs=sizes.ppo_micro_batch_size_per_gpu or
            self.config.ppo_micro_batch_size_per_gpu, use_remove_padding=model.use_remove_padding,
            grad_clip=self.config.grad_clip, pad_token_id=self.tokenizer.pad_token_id, device=self.device,
            attn_implementation=model.attn_implementation, attn_key=f"{self.config_key}.model.attn_implementation")
        self.optimizer_offload.offload()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_reward_model(self, data: DataProto) -> DataProto:
        """One Bradley-Terry optimizer step on a pair batch; returns ``meta_info["metrics"]``."""
        start = time.perf_counter()
        peak: dict[str, float] = {}
        with phase_peak(peak, "perf/peak_rss_gib/update_reward_model"), self.optimizer_offload:
            metrics: dict[str, Any] = self.reward_model.update(data)
        metrics.update(peak)
        metrics["rm/lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        metrics["timing_s/update_reward_model_worker"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_pair_scores(self, data: DataProto) -> DataProto:
        """``chosen_scores`` and ``rejected_scores`` [B] of a pair batch (no grad)."""
        chosen, rejected = self.reward_model.compute_pair_scores(data)
        return DataProto.from_dict({"chosen_scores": chosen, "rejected_scores": rejected})

    def score_statistics(self) -> Optional[tuple[float, float]]:
        """``(mean, std)`` to normalise scores with: the model config's, unless ``normalize`` is False."""
        hf_config = self.module.config
        stats = (getattr(hf_config, "mean", None), getattr(hf_config, "std", None))
        if self.normalize is False or stats[0] is None or stats[1] is None:
            return None
        return float(stats[0]), float(stats[1])

    def _rm_inputs(self, data: DataProto) -> DataProto:
        """``rm_input_ids`` etc. [B, L]: each row's prompt messages (``raw_prompt``) and its decoded
        response (the policy's ``input_tokenizer``) rendered by the reward model's chat template."""
        responses = data.batch["responses"]
        lengths = data.batch["attention_mask"][:, -responses.shape[1]:].sum(-1).tolist()
        texts = self.input_tokenizer.batch_decode([responses[i, :n].tolist() for i, n in enumerate(lengths)],
                                                  skip_special_tokens=True)
        prompts = data.non_tensor_batch["raw_prompt"]
        sequences = [rm_sequence_ids(self.tokenizer, [dict(m) for m in prompts[i]], texts[i], self.max_length,
                                     truncation="left", allow_empty=True) for i in range(len(data))]
        tensors = sequence_tensors(sequences, self.tokenizer.pad_token_id)
        return DataProto.from_dict({f"rm_{k}": v for k, v in tensors.items()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """Score a rollout batch: ``rm_scores`` [B, R] (normalised, at each response's last token, as
        the reward managers place scores) and ``rm_raw_scores`` [B]. Rows that already carry
        ``rm_input_ids`` / ``rm_attention_mask`` / ``rm_position_ids`` are scored as given."""
        metrics: dict[str, Any] = {}
        with phase_peak(metrics, "perf/peak_rss_gib/rm_score"):
            inputs = data if "rm_input_ids" in data.batch.keys() else self._rm_inputs(data)
            raw = self.reward_model.compute_scores(inputs, prefix="rm_")  # [B]
        stats = self.score_statistics()
        scores = (raw - stats[0]) / stats[1] if stats else raw
        responses = data.batch["responses"]
        last = (data.batch["attention_mask"][:, -responses.shape[1]:].sum(-1) - 1).clamp(min=0)  # [B]
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        token_level[torch.arange(len(data)), last] = scores
        return DataProto.from_dict({"rm_scores": token_level, "rm_raw_scores": raw}, meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_score_normalization(self, mean: float, std: float) -> None:
        """Record the score statistics in the model config (saved with every checkpoint and export)."""
        if not (std > 0 and torch.isfinite(torch.tensor([mean, std])).all()):
            raise ValueError(f"score normalisation needs a finite mean and a std > 0, got mean={mean}, std={std}")
        self.module.config.mean = float(mean)
        self.module.config.std = float(std)
