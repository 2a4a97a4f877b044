"""Reward-model inputs: chat-template rendering, truncation, pair batches and their bad rows."""

import json

import pytest
import torch

from hybrid_rl.data.reward_data import PreferenceDataset, pair_tensors, rm_sequence_ids, sequence_tensors


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    return load_tokenizer(tiny_model_dir)


PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


def test_sequence_is_the_rendered_conversation(tokenizer):
    ids = rm_sequence_ids(tokenizer, PROMPT, "2 + 3 = 5\n#### 5", max_length=1000)
    text = tokenizer.apply_chat_template(PROMPT + [{"role": "assistant", "content": "2 + 3 = 5\n#### 5"}],
                                         tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids).endswith("#### 5<|im_end|>\n")  # the score is read after the end of the turn


def test_truncation_keeps_the_chosen_side(tokenizer):
    full = rm_sequence_ids(tokenizer, PROMPT, "a long answer " * 5, max_length=1000)
    assert rm_sequence_ids(tokenizer, PROMPT, "a long answer " * 5, 20, "left") == full[-20:]
    assert rm_sequence_ids(tokenizer, PROMPT, "a long answer " * 5, 20, "right") == full[:20]
    with pytest.raises(ValueError, match=r"exceeds data.max_length=20\. Fix: raise data.max_length"):
        rm_sequence_ids(tokenizer, PROMPT, "a long answer " * 5, 20)
    with pytest.raises(ValueError, match="data.truncation='middle' must be one of"):
        rm_sequence_ids(tokenizer, PROMPT, "x", 20, "middle")


def test_pair_tensors_are_right_padded_one_row_per_pair():
    out = pair_tensors([[5, 6, 7], [8]], [[9], [10, 11]], pad_token_id=0, margins=[1.0, 0.5])
    assert out["chosen_input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["chosen_attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["rejected_position_ids"].tolist() == [[0, 0], [0, 1]]
    assert out["margin"].tolist() == [1.0, 0.5]
    assert pair_tensors([[1]], [[2]], 0)["margin"].tolist() == [0.0]
    assert sequence_tensors([[4, 4]], 0, width=4)["input_ids"].tolist() == [[4, 4, 0, 0]]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_dataset_collates_pairs_with_margins_and_sources(tmp_path, tokenizer):
    rows = [{"prompt": "q1", "chosen": "good", "rejected": "bad", "margin": 2.0, "data_source": "s"},
            {"prompt": [{"role": "user", "content": "q2"}], "chosen": "yes", "rejected": "no"}]
    data = PreferenceDataset(_jsonl(tmp_path / "p.jsonl", rows), tokenizer, max_length=200)
    batch = data.collate_fn([data[0], data[1]])
    assert batch["margin"].tolist() == [2.0, 0.0]
    assert list(batch["data_source"]) == ["s", ""]
    assert batch["chosen_input_ids"].shape[0] == 2 and batch["rejected_attention_mask"].dtype == torch.long


@pytest.mark.parametrize("row, kwargs, message", [
    ({"prompt": "q", "chosen": "  ", "rejected": "b"}, {}, r"row 1: the 'chosen' response is empty"),
    ({"prompt": "q", "chosen": "a" * 50, "rejected": "b"}, {"max_length": 30}, r"p.jsonl, row 1: .*exceeds data.max_length=30"),
    ({"prompt": "q", "chosen": "x" * 40 + "a", "rejected": "x" * 40 + "b"}, {"max_length": 20, "truncation": "right"},
     r"p.jsonl, row 1: chosen and rejected are the same 20 tokens after truncation"),
])
def test_bad_pairs_are_one_line_naming_the_pair(tmp_path, tokenizer, row, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PreferenceDataset(_jsonl(tmp_path / "p.jsonl", [row]), tokenizer, **kwargs)
