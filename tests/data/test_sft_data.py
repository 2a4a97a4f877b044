"""SFT examples: the row shapes, the loss mask on assistant turns only, truncation, bad rows."""

import json

import pytest

from hybrid_rl.data.sft import example_from_row, load_sft_examples, tokenize_example
from hybrid_rl.utils.testing import build_byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def _targets(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_prompt_response_row_masks_only_the_response(tok):
    ex = example_from_row({"prompt": [{"role": "user", "content": "2+2?"}], "response": "4", "data_source": "a",
                           "reward_model": {"ground_truth": "4"}})
    ids, mask = tokenize_example(tok, ex.messages, max_length=100)
    assert tok.decode(ids) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    assert _targets(tok, ids, mask) == "4<|im_end|>\n"  # the answer and its end of turn, nothing else
    prompt = tok.apply_chat_template(ex.messages[:1], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    assert ids[: len(prompt_ids)] == prompt_ids  # the prompt exactly as RL / inference sees it
    assert ex.data_source == "a" and ex.extra == {"reward_model": {"ground_truth": "4"}}


def test_multiturn_trains_every_assistant_turn(tok):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"}]
    ex = example_from_row({"conversation": messages}, messages_key="conversation")
    ids, mask = tokenize_example(tok, ex.messages, max_length=200)
    assert _targets(tok, ids, mask) == "b<|im_end|>\nd<|im_end|>\n"
    assert tok.decode(ids) == tok.apply_chat_template(messages, tokenize=False)


def test_truncation_modes(tok):
    messages = [{"role": "user", "content": "x" * 30}, {"role": "assistant", "content": "yes"}]
    full, _ = tokenize_example(tok, messages, max_length=100)
    with pytest.raises(ValueError, match=r"exceeds data.max_length=20. Fix: raise data.max_length"):
        tokenize_example(tok, messages, max_length=20)
    left, mask = tokenize_example(tok, messages, max_length=20, truncation="left")
    assert left == full[-20:] and _targets(tok, left, mask) == "yes<|im_end|>\n"
    with pytest.raises(ValueError, match="no assistant token is left"):
        tokenize_example(tok, messages, max_length=20, truncation="right")
    with pytest.raises(ValueError, match="data.truncation='middle'"):
        tokenize_example(tok, messages, max_length=20, truncation="middle")


@pytest.mark.parametrize("row, kwargs, message", [
    ({"question": "q", "response": "r"}, {}, r"no 'prompt' column .* data.prompt_key"),
    ({"prompt": "q"}, {}, r"no 'response' column .* data.response_key"),
    ({"prompt": "q", "response": " "}, {}, r"'response' response is empty"),
    ({"prompt": 5, "response": "r"}, {}, r"'prompt' must be a string or a non-empty list"),
    ({"messages": [{"role": "user", "content": "q"}]}, {"messages_key": "messages"}, r"no non-empty assistant turn"),
    ({"prompt": "q"}, {"messages_key": "messages"}, r"no 'messages' column .* data.multiturn.messages_key"),
])
def test_each_bad_row_is_one_line(tmp_path, row, kwargs, message):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_sft_examples(str(path), **kwargs)
    assert str(info.value).startswith(f"{path}, row 1: ")


def test_a_template_that_rewrites_history_is_refused():
    class Rewriting:  # drops earlier turns when a new one starts: not prefix-consistent
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return messages[-1]["content"] + ("|gen" if add_generation_prompt else "") if messages else ""

    with pytest.raises(ValueError, match="does not render a conversation as a prefix"):
        tokenize_example(Rewriting(), [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], 50)
