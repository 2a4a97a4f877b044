"""DataParallelRewardModel: last-token scores vs HF sequence classification, the Bradley-Terry update
(its loss, micro-batch invariance, learning), and the reward-model export layout."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.algorithms.reward_loss import bradley_terry_loss
from hybrid_rl.data.reward_data import pair_tensors, sequence_tensors
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.builders import build_optimizer
from hybrid_rl.workers.config import OptimConfig
from hybrid_rl.workers.forward import sequence_scores
from hybrid_rl.workers.model_loader import load_value_model
from hybrid_rl.workers.reward_model import DataParallelRewardModel

PAD = 0


@pytest.fixture(scope="module")
def rm_module(tiny_model_dir):
    torch.manual_seed(0)
    return load_value_model(tiny_model_dir, override_config={"token_classification_bias": False})


def _sequences(num: int, seed: int, lo: int = 3, hi: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (num,), generator=g).tolist()
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in lengths]


def _pairs(num: int = 8, seed: int = 0, margins=None) -> DataProto:
    return DataProto.from_dict(pair_tensors(_sequences(num, seed), _sequences(num, seed + 1), PAD, margins))


@pytest.mark.parametrize("remove_padding", [False, True])
def test_sequence_scores_equal_hf_sequence_classification(rm_module, tmp_path, remove_padding):
    from transformers import AutoModelForSequenceClassification

    folder = tmp_path / "rm"
    export = copy.deepcopy(rm_module)
    export.config.architectures = ["LlamaForSequenceClassification"]
    export.config.pad_token_id = PAD
    export.save_pretrained(folder)
    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    rows = sequence_tensors(_sequences(6, 3), PAD)
    with torch.no_grad():
        ours = sequence_scores(rm_module, rows["input_ids"], rows["attention_mask"], rows["position_ids"],
                               remove_padding)
        hf = reference(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits[:, 0]
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, hf, rtol=1e-4, atol=1e-5)


def test_left_and_right_padding_give_the_same_scores(rm_module):
    seqs = _sequences(5, 4)
    right = sequence_tensors(seqs, PAD)
    width = right["input_ids"].shape[1]
    left = sequence_tensors([[PAD] * (width - len(s)) + s for s in seqs], PAD)
    left["attention_mask"] = torch.stack([torch.tensor([0] * (width - len(s)) + [1] * len(s)) for s in seqs])
    left["position_ids"] = (left["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = sequence_scores(rm_module, right["input_ids"], right["attention_mask"], right["position_ids"], False)
        b = sequence_scores(rm_module, left["input_ids"], left["attention_mask"], left["position_ids"], False)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_update_reports_the_bradley_terry_loss_of_the_scores_before_it(rm_module):
    model = copy.deepcopy(rm_module)
    data = _pairs(margins=[0.5] * 8)
    rm = DataParallelRewardModel(model, build_optimizer(model, OptimConfig(lr=1e-3, weight_decay=0.0)),
                                 micro_batch_pairs=3, grad_clip=None, pad_token_id=PAD)
    chosen, rejected = rm.compute_pair_scores(data)
    expected = bradley_terry_loss(chosen, rejected, torch.full((8,), 0.5)).item()
    metrics = rm.update(data)
    assert metrics["rm/loss"][0] == pytest.approx(expected, rel=1e-5)
    assert metrics["rm/accuracy"][0] == pytest.approx(float((chosen > rejected).float().mean()))
    assert set(metrics) >= {"rm/margin", "rm/chosen_mean", "rm/rejected_mean", "rm/grad_norm"}


def _weights_after_update(base, data, micro: int, remove_padding: bool) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(base)  # SGD: Adam's first step is sign(g), which magnifies rounding noise
    rm = DataParallelRewardModel(model, torch.optim.SGD(model.parameters(), lr=1e-2),
                                 micro_batch_pairs=micro, use_remove_padding=remove_padding, grad_clip=None,
                                 pad_token_id=PAD)
    metrics = rm.update(data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics["rm/grad_norm"][0]


def test_update_is_micro_batch_and_packing_invariant(rm_module):
    data = _pairs()
    reference, ref_norm = _weights_after_update(rm_module, data, 8, False)
    moved = max((reference[k] - v).abs().max().item() for k, v in rm_module.state_dict().items())
    assert moved > 1e-4
    for micro, packed in ((1, False), (3, True), (8, True)):
        weights, norm = _weights_after_update(rm_module, data, micro, packed)
        assert norm == pytest.approx(ref_norm, rel=1e-4)
        for name, value in reference.items():
            torch.testing.assert_close(weights[name], value, rtol=0, atol=1e-5, msg=f"{name} micro={micro}")


def test_training_separates_chosen_from_rejected(rm_module):
    model = copy.deepcopy(rm_module)
    # chosen sequences end in token 7, rejected ones in token 9: a rule the head can learn
    body = _sequences(16, 6)
    chosen = [s + [7] for s in body]
    rejected = [s + [9] for s in body]
    data = DataProto.from_dict(pair_tensors(chosen, rejected, PAD))
    rm = DataParallelRewardModel(model, build_optimizer(model, OptimConfig(lr=3e-3, weight_decay=0.0)),
                                 micro_batch_pairs=8, pad_token_id=PAD)
    history = [rm.update(data) for _ in range(15)]
    assert history[-1]["rm/loss"][0] < 0.5 * history[0]["rm/loss"][0]
    chosen_scores, rejected_scores = rm.compute_pair_scores(data)
    assert bool((chosen_scores > rejected_scores).all())


def test_scoring_only_model_refuses_updates(rm_module):
    with pytest.raises(ValueError, match="without an optimizer"):
        DataParallelRewardModel(rm_module, None).update(_pairs())
