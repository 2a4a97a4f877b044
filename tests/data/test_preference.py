"""Preference pairs from the public formats (hand-written files in each shape), the bad-input lines,
and the local SFT / preference-pair generators judged by the rule scorers."""

import json
import re
import sys

import gsm8k_data
from gsm8k_data import FakeDatasets
import pytest

from hybrid_rl.data.arithmetic import generate_arithmetic
from hybrid_rl.data.preference import load_preference_pairs, pair_from_row, parse_hh_dialogue
from hybrid_rl.data.rlhf_data import REJECTED_KINDS, arithmetic_examples, gsm8k_examples, main
from hybrid_rl.data.rows import read_rows
from hybrid_rl.reward.registry import default_compute_score

USER = {"role": "user", "content": "What is 2 + 2?"}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_hh_rlhf_strings(tmp_path):
    row = {"chosen": "\n\nHuman: hi\n\nAssistant: hello!\n\nHuman: 2+2?\n\nAssistant: 4",
           "rejected": "\n\nHuman: hi\n\nAssistant: hello!\n\nHuman: 2+2?\n\nAssistant: 5"}
    (pair,) = load_preference_pairs(_jsonl(tmp_path / "hh.jsonl", [row]))
    assert pair.prompt == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"},
                           {"role": "user", "content": "2+2?"}]
    assert (pair.chosen, pair.rejected) == ("4", "5")
    assert parse_hh_dialogue("Human: a\n\nAssistant: b") == [{"role": "user", "content": "a"},
                                                            {"role": "assistant", "content": "b"}]


def test_ultrafeedback_messages_with_a_prompt_string(tmp_path):
    row = {"prompt": "What is 2 + 2?", "chosen": [USER, {"role": "assistant", "content": "4"}],
           "rejected": [USER, {"role": "assistant", "content": "22"}], "score_chosen": 9.0, "score_rejected": 2.0}
    (pair,) = load_preference_pairs(_jsonl(tmp_path / "uf.jsonl", [row]))
    assert pair.prompt == [USER] and (pair.chosen, pair.rejected) == ("4", "22")


@pytest.mark.parametrize("row", [
    # TRL conversational, implicit prompt
    {"chosen": [USER, {"role": "assistant", "content": "4"}], "rejected": [USER, {"role": "assistant", "content": "5"}]},
    # TRL conversational, explicit prompt
    {"prompt": [USER], "chosen": [{"role": "assistant", "content": "4"}],
     "rejected": [{"role": "assistant", "content": "5"}]},
    # TRL standard, explicit prompt, with a margin
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5", "margin": 1.5},
])
def test_trl_shapes(row):
    pair = pair_from_row(row)
    assert pair.prompt == [USER] and (pair.chosen, pair.rejected) == ("4", "5")
    assert pair.margin == row.get("margin")


def test_openrlhf_style_keys(tmp_path):
    row = {"question": "What is 2 + 2?", "good": "4", "bad": "5", "data_source": "arith"}
    (pair,) = load_preference_pairs(_jsonl(tmp_path / "o.jsonl", [row]), prompt_key="question", chosen_key="good",
                                    rejected_key="bad")
    assert (pair.chosen, pair.rejected, pair.data_source) == ("4", "5", "arith")


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "rejected": "5"}, r"row 1: no 'chosen' column .* data.chosen_key="),
    ({"prompt": "q", "chosen": "4"}, r"no 'rejected' column"),
    ({"prompt": "q", "chosen": "  ", "rejected": "5"}, r"the 'chosen' response is empty"),
    ({"prompt": "q", "chosen": "4", "rejected": ""}, r"the 'rejected' response is empty"),
    ({"prompt": "q", "chosen": "4", "rejected": "4"}, r"identical"),
    ({"chosen": "4", "rejected": "5"}, r"share no prompt .*prompt_key="),  # neither HH nor an implicit prompt
    ({"chosen": [USER, {"role": "assistant", "content": "4"}, {"role": "assistant", "content": "x"}],
      "rejected": [USER, {"role": "assistant", "content": "5"}]}, r"exactly one assistant message"),
    ({"chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]},
     r"share no conversation ending with a user turn"),
    ({"prompt": 3, "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]},
     r"'prompt' must be a string or a list of"),
    ({"prompt": "q", "chosen": [{"text": "4"}], "rejected": "5"}, r"'chosen' must be a string or a list of"),
])
def test_each_bad_row_is_one_line_naming_file_and_row(tmp_path, row, message):
    path = _jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(ValueError, match=message) as info:
        load_preference_pairs(path)
    assert str(info.value).startswith(f"{path}, row 1: ") and "\n" not in str(info.value)


def test_arithmetic_data_shares_the_rl_split_and_the_scorer_agrees(tmp_path):
    paths = main(["--task", "arithmetic", "--out_dir", str(tmp_path / "rlhf")])
    _, rl_test = generate_arithmetic(tmp_path / "rl", num_train=100, num_test=200, seed=0, max_digits=1)
    held_out = {r["prompt"][0]["content"] for r in read_rows(rl_test)}
    sft_test = read_rows(paths["sft_test"])
    assert {r["prompt"][0]["content"] for r in sft_test} == held_out  # the RL task's held-out problems
    train_prompts = {r["prompt"][0]["content"] for r in read_rows(paths["pairs_train"])}
    assert len(train_prompts) == 100 and not train_prompts & held_out
    pairs = read_rows(paths["pairs_train"])
    assert len(pairs) == 400  # every kind for every training problem
    assert all(r["rejected_kind"] == k for r, k in zip(pairs, REJECTED_KINDS * 100))
    finals = [r["rejected"].rsplit("#### ", 1)[-1] for r in pairs if r["rejected_kind"] == "wrong_number"]
    prompts = [p["prompt"][0]["content"] for p in pairs if p["rejected_kind"] == "wrong_number"]
    copied = sum(f in re.findall(r"\d+", text) for f, text in zip(finals, prompts))  # an operand or the example's 42
    assert 30 < copied < 70, copied  # half the wrong numbers are distractors from the prompt
    for row in pairs + read_rows(paths["pairs_test"]):
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score("arithmetic", row["chosen"], truth) == 1.0
        assert default_compute_score("arithmetic", row["rejected"], truth) == 0.0, row
    for row in (r for r in pairs if r["rejected_kind"] == "wrong_arithmetic"):  # wrong, and consistently so
        equation, final = row["rejected"].split("\n#### ")
        assert equation.split(" = ")[1] == final != row["reward_model"]["ground_truth"]
    loaded = load_preference_pairs(paths["pairs_test"])
    assert len(loaded) == 200 and loaded[0].prompt == sft_test[0]["prompt"]
    assert all(r["response"] == p["chosen"] for r, p in zip(sft_test, read_rows(paths["pairs_test"])))
    assert arithmetic_examples(3, 2)["test"][1][0]["chosen"].endswith("#### " + arithmetic_examples(3, 2)["test"][1][0]["reward_model"]["ground_truth"])


def test_gsm8k_pairs_from_the_real_files():
    source = gsm8k_data.source()  # $GSM8K_DIR or ../shared, else openai/gsm8k from the cache; a skip otherwise
    examples = gsm8k_examples(source.get("input_dir"), limit=30)
    sft, pairs = examples["test"]
    assert len(sft) == len(pairs) == 30 and "<<" not in sft[0]["response"]
    assert sft[0]["prompt"][0]["content"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert sft[0]["reward_model"]["ground_truth"] == "18"  # the first test answer of openai/gsm8k
    for row in pairs:
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score("openai/gsm8k", row["chosen"], truth) == 1.0
        assert default_compute_score("openai/gsm8k", row["rejected"], truth) == 0.0, row
    with pytest.raises(ValueError, match="no GSM8K file .*leave --gsm8k_dir out to load openai/gsm8k"):
        gsm8k_examples("/nonexistent")


def test_gsm8k_without_a_folder_comes_from_datasets_as_scripts_data_gsm8k(monkeypatch, tmp_path, capsys):
    good = {"question": "Ann has 2 apples and buys 3. How many?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"}
    fake = FakeDatasets({"train": [good, {"question": "Q?", "answer": "1,000 - 1 = 999\n#### 999"}], "test": [good]})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    paths = main(["--task", "gsm8k", "--out_dir", str(tmp_path / "out")])
    assert fake.calls == [(("openai/gsm8k", "main"), {})]  # veRL's call, once for both splits
    sft = read_rows(paths["sft_train"])
    assert [r["response"] for r in sft] == ["2 + 3 = 5\n#### 5", "1,000 - 1 = 999\n#### 999"]
    assert sft[1]["reward_model"]["ground_truth"] == "999" and sft[1]["data_source"] == "openai/gsm8k"
    assert len(read_rows(paths["pairs_train"])) == 8 and len(read_rows(paths["pairs_test"])) == 1
    gsm8k_examples(hf_dataset="me/gsm8k_copy")
    assert fake.calls[-1] == (("me/gsm8k_copy", "main"), {})
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets({"train": [{"question": "Q?"}], "test": []}))
    with pytest.raises(ValueError) as info:
        gsm8k_examples()
    assert str(info.value) == ("openai/gsm8k[train] row 0: needs GSM8K's 'question' and 'answer' texts (columns: "
                               "['question']). Fix: give the openai/gsm8k JSONL files.")
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets(error=ConnectionError("Couldn't reach the hub")))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:  # the command line: one line, exit 2
        main(["--task", "gsm8k", "--out_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "rlhf_data: error: could not load 'openai/gsm8k' ('main') with datasets: it is not in the datasets cache "
        "and HF_DATASETS_OFFLINE=1 forbids the download (ConnectionError: Couldn't reach the hub). Fix: pass "
        "--gsm8k_dir <folder with train.jsonl and test.jsonl> (offline), or run once with network access to fill "
        "the datasets cache\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--task", "gsm8k", "--out_dir", str(tmp_path / "out"), "--gsm8k_dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"rlhf_data: error: no GSM8K file {tmp_path / 'none' / 'train.jsonl'}. Fix: ")


def test_gsm8k_files_with_a_bad_line_or_answer_are_one_line(tmp_path):
    good = {"question": "Ann has 2 apples and buys 3. How many?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"}
    (tmp_path / "test.jsonl").write_text(json.dumps(good) + "\n")
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(good) + "\n\n{oops\n")
    with pytest.raises(ValueError) as info:
        gsm8k_examples(str(tmp_path))
    assert str(info.value) == (f"data file {str(train)!r} line 3: invalid JSON (Expecting property name enclosed in "
                               "double quotes at column 2); fix or remove the line")
    train.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "answer": "5"}) + "\n")
    with pytest.raises(ValueError) as info:
        gsm8k_examples(str(tmp_path))
    assert str(info.value) == (f"{train}, row 3: the answer has no '#### <number>' line. Fix: give the openai/gsm8k "
                               "JSONL files (each answer ends with '#### <number>').")
    train.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl, row 1: needs GSM8K's 'question' and 'answer' texts "
                                         r"\(columns: \['question'\]\)"):
        gsm8k_examples(str(tmp_path))
    train.write_text(json.dumps(good) + "\n")
    sft, pairs = gsm8k_examples(str(tmp_path))["train"]
    assert sft[0]["response"] == "2 + 3 = 5\n#### 5" and len(pairs) == 4  # one pair of each rejected kind
