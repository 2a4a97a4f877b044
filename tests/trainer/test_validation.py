"""Validation metrics: pass@k estimator, per-source summaries, and a run with a fake generator."""

import json
from collections import defaultdict
from math import comb

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core.validation import _extend_extras, ks_for, pass_at_k, run_validation, summarize
from hybrid_rl.utils.testing import build_byte_tokenizer


def test_pass_at_k_matches_definition():
    # n=4, c=1: P(at least one correct in 2 draws) = 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(8, 3, 4) == pytest.approx(1 - comb(5, 4) / comb(8, 4))
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


def test_summarize_per_data_source():
    sources = ["a"] * 4 + ["b"] * 2
    uids = ["p0", "p0", "p1", "p1", "q0", "q0"]
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    m = summarize(sources, uids, scores, [s > 0 for s in scores], n=2)
    assert m["val-core/a/reward/mean@2"] == pytest.approx(0.25)
    assert m["val-core/a/reward/pass@1"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert m["val-core/a/reward/pass@2"] == pytest.approx(0.5)
    assert m["val-core/b/reward/mean@2"] == 1.0 and m["val-core/b/reward/pass@2"] == 1.0


def _fake_run(tmp_path, extra_info=lambda data, scores: {}, batches=1):
    """run_validation over ``batches`` copies of two prompts, n=2, a fake model that solves the first."""
    tok = build_byte_tokenizer()
    prompts = [tok.encode("1+1="), tok.encode("2+2=")]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention = (input_ids != 0).long()
    batch = DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention, "position_ids": attention.cumsum(-1)},
        non_tensors={"data_source": ["toy", "toy"], "reward_model": [{"ground_truth": "2"}, {"ground_truth": "4"}]},
    )
    answers = {"1+1=": "2", "2+2=": "5"}  # the fake model gets the second one wrong

    def generate(gen):
        assert len(gen) == 4  # 2 prompts x n=2
        rows = []
        for ids, mask in zip(gen.batch["input_ids"], gen.batch["attention_mask"]):
            text = tok.decode(ids[mask.bool()].tolist())
            rows.append(tok.encode(answers[text]) + [tok.eos_token_id])
        responses = torch.tensor(rows)
        return DataProto.from_dict(tensors={
            "prompts": gen.batch["input_ids"], "responses": responses, "response_mask": torch.ones_like(responses),
            "input_ids": torch.cat([gen.batch["input_ids"], responses], 1),
            "attention_mask": torch.cat([gen.batch["attention_mask"], torch.ones_like(responses)], 1),
        })

    def reward_fn(data, return_dict):
        scores = torch.zeros(data.batch["responses"].shape)
        for i, gt in enumerate(data.non_tensor_batch["reward_model"]):
            text = tok.decode(data.batch["responses"][i].tolist(), skip_special_tokens=True)
            scores[i, -1] = float(text == gt["ground_truth"])
        return {"reward_tensor": scores, "reward_extra_info": extra_info(data, scores)}

    m = run_validation([batch] * batches, generate, reward_fn, tok, n=2, step=3, num_logged=1, run_dir=str(tmp_path))
    return m


def test_run_validation_with_fake_generator(tmp_path):
    m = _fake_run(tmp_path)
    assert m["val-core/toy/reward/mean@2"] == 0.5
    assert m["val-core/toy/reward/pass@2"] == 0.5
    assert m["val-aux/response_length/mean"] == 2.0
    logged = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert logged == [{"step": 3, "data_source": "toy", "prompt": "1+1=", "response": "2", "ground_truth": "2", "score": 1.0}]


def test_the_scorers_answers_and_numbers_give_verls_best_and_majority_metrics(tmp_path):
    calls = []

    def extra_info(data, scores):
        calls.append(len(data))
        solved = (scores.sum(-1) > 0).tolist()
        info = {"acc": solved, "pred": ["2" if ok else "5" for ok in solved], "score": scores.sum(-1).tolist()}
        return info if len(calls) > 1 else {}  # the first batch's scorer gave no extra keys

    m = _fake_run(tmp_path, extra_info, batches=2)
    # each batch: prompt "1+1=" solved twice, "2+2=" never. The first batch's rows have no acc (they
    # count 0, as a failed row) and no answers (no vote): acc is the headline variable once given
    assert m["val-core/toy/acc/best@2/mean"] == 0.25 and m["val-core/toy/acc/mean@2"] == 0.25
    assert m["val-core/toy/acc/maj@2/mean"] == 0.5 and m["val-aux/toy/reward/maj@2/mean"] == 0.5
    assert m["val-aux/toy/reward/best@2/mean"] == 0.5 and m["val-core/toy/reward/mean@2"] == 0.5
    assert not any("/score/" in key for key in m)


def test_extra_keys_line_up_with_their_samples_across_batches():
    extras: defaultdict = defaultdict(list)
    _extend_extras(extras, {}, 0, 2)  # batch 1: no extra keys
    _extend_extras(extras, {"acc": [1, 0], "reward": [9, 9], "scalar": 3}, 2, 2)  # batch 2
    _extend_extras(extras, {"pred": ["4"]}, 4, 1)  # batch 3: acc missing
    assert dict(extras) == {"acc": [None, None, 1, 0], "scalar": [None, None, None, None],
                            "pred": [None, None, None, None, "4"]}  # acc padded at the end by run_validation
