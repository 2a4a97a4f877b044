"""Data as public dumps ship it: every file form, folders and globs of shards, gzip, and the
``data.bad_rows`` policy on HH-RLHF- and UltraFeedback-shaped files with bad rows mixed in."""

import gzip
import json
import logging

import pandas as pd
import pytest

from hybrid_rl.data.bad_rows import BadRows
from hybrid_rl.data.files import expand_data_files, read_rows
from hybrid_rl.data.preference import implicit_prompt, load_preference_pairs
from hybrid_rl.data.sft import load_sft_examples

ROWS = [{"data_source": "s", "prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": str(i)}}
        for i in range(5)]


def _write(path, rows, form):
    text = {"jsonl": "\n".join(json.dumps(r) for r in rows) + "\n", "array": json.dumps(rows),
            "wrapped": json.dumps({"data": rows}), "columns": json.dumps({k: [r[k] for r in rows] for k in rows[0]}),
            "lines_as_json": "\n".join(json.dumps(r) for r in rows)}[form]
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name, form", [
    ("r.jsonl", "jsonl"), ("r.json", "array"), ("r.json", "wrapped"), ("r.json", "columns"),
    ("r.json", "lines_as_json"), ("r.jsonl.gz", "jsonl"), ("r.json.gz", "array"), ("r.json.gz", "lines_as_json"),
])
def test_every_json_form_reads_the_same_rows(tmp_path, name, form):
    assert read_rows(_write(tmp_path / name, ROWS, form)) == ROWS


def test_parquet_shards_in_a_folder_and_a_glob(tmp_path):
    folder = tmp_path / "data"
    (folder / "train").mkdir(parents=True)  # the Hub's <split>/ sub-folders: read recursively, by path
    pd.DataFrame(ROWS[:2]).to_parquet(folder / "train" / "train-00000-of-00002.parquet")
    pd.DataFrame(ROWS[2:]).to_parquet(folder / "train" / "train-00001-of-00002.parquet")
    (folder / "README.md").write_text("not data")
    (folder / ".cache").mkdir()
    _write(folder / ".cache" / "x.jsonl", ROWS, "jsonl")  # hidden: left out
    files = expand_data_files(str(folder))
    assert [f.rsplit("/", 1)[1] for f in files] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert [r for f in files for r in read_rows(f)] == ROWS
    assert expand_data_files(f"{folder}/**/*.parquet") == files
    with pytest.raises(ValueError, match="the pattern matches no file"):
        expand_data_files(f"{folder}/*.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no data files"):
        expand_data_files(str(tmp_path / "empty"))


@pytest.mark.parametrize("content, message", [
    (b"\x1f\x8b\x08\x00cut", "is cut short"),  # a cut gzip stream
    (None, "contains no rows"),
])
def test_unreadable_or_empty_gzip_is_one_line(tmp_path, content, message):
    path = tmp_path / "r.jsonl.gz"
    if content is None:
        with gzip.open(path, "wt") as f:
            f.write("\n")
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        read_rows(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def _hh(prompt, answer):
    return f"\n\nHuman: {prompt}\n\nAssistant: {answer}"


def _hh_file(tmp_path):
    """HH-RLHF's raw shape (chosen/rejected whole dialogues), gzipped, 200 rows, 2 of them bad."""
    rows = [{"chosen": _hh(f"q{i}", f"good {i}"), "rejected": _hh(f"q{i}", f"bad {i}")} for i in range(200)]
    rows[17]["rejected"] = rows[17]["chosen"]  # identical
    rows[90]["chosen"] = _hh("q90", "")  # an empty final assistant turn
    return _write(tmp_path / "train.jsonl.gz", rows, "jsonl")


def _ultrafeedback_file(tmp_path):
    """UltraFeedback-binarized's shape (prompt + message lists), gzipped JSON, 300 rows, 3 bad."""
    def convo(i, answer, user=None):
        return [{"role": "user", "content": user or f"q{i}"}, {"role": "assistant", "content": answer}]

    rows = [{"prompt": f"q{i}", "chosen": convo(i, f"good {i}"), "rejected": convo(i, f"bad {i}"),
             "score_chosen": 8.0, "score_rejected": 3.0} for i in range(300)]
    rows[5]["rejected"] = convo(5, "x", user="another question")  # dialogues diverge before the last turn
    rows[6]["rejected"] = rows[6]["rejected"] + [{"role": "user", "content": "more?"}]
    rows[250]["chosen"] = rows[250]["rejected"]
    return _write(tmp_path / "train_prefs.json.gz", rows, "array")


def test_skip_reports_exactly_the_bad_hh_rows(tmp_path, caplog):
    path = _hh_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.data.bad_rows"):
        pairs = load_preference_pairs(path, bad_rows="skip")
    assert len(pairs) == 198 and pairs[0].prompt == [{"role": "user", "content": "q0"}]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "left out 2 of 200 preference pairs (1.00%)" in line
    assert "1 identical chosen and rejected, 1 empty response" in line
    assert "train.jsonl.gz row 18: identical chosen and rejected; train.jsonl.gz row 91: empty response" in line


def test_skip_reports_exactly_the_bad_ultrafeedback_rows(tmp_path):
    policy = BadRows("skip", 0.01, what="preference pairs")
    from hybrid_rl.data.preference import iter_preference_pairs

    kept = list(iter_preference_pairs(_ultrafeedback_file(tmp_path), bad_rows=policy))
    assert len(kept) == 297 and [number for _, number, _ in kept[4:6]] == [5, 8]  # array elements, from 1
    assert [(place, r) for _, place, r in policy.skipped] == [
        ("row 6", "conversations diverge before the last turn"), ("row 7", "conversations diverge before the last turn"),
        ("row 251", "identical chosen and rejected")]
    policy.finish()  # 1% of 300: three bad rows are allowed


def test_error_names_the_first_bad_row_and_too_many_bad_rows_refuse(tmp_path):
    path = _hh_file(tmp_path)
    with pytest.raises(ValueError) as info:
        load_preference_pairs(path)
    assert str(info.value).startswith(f"{path}, row 18: the chosen and rejected responses are identical")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"left out 2 of 200 .* more than data.max_bad_fraction=0.005"):
        load_preference_pairs(path, bad_rows="skip", max_bad_fraction=0.005)
    with pytest.raises(ValueError, match="data.bad_rows='drop' must be one of"):
        load_preference_pairs(path, bad_rows="drop")


def test_trl_implicit_prompt_pairs():
    assert implicit_prompt("The sky is blue.", "The sky is green.") == ("The sky is", "blue.", "green.")
    assert implicit_prompt("2 + 2 = 4", "2 + 2 = 5") == ("2 + 2 =", "4", "5")
    with pytest.raises(ValueError, match="share no prompt"):
        implicit_prompt("yes", "no")


def test_rl_prompt_rows_skip_bad_ones(tmp_path, caplog):
    from hybrid_rl.data import RLHFDataset
    from hybrid_rl.utils.testing import build_byte_tokenizer

    rows = [dict(r) for r in ROWS * 40]
    rows[3] = {**rows[3], "prompt": []}
    path = _write(tmp_path / "p.jsonl.gz", rows, "jsonl")
    tokenizer = build_byte_tokenizer()
    with pytest.raises(ValueError, match=r"p.jsonl.gz' row 4: field 'prompt' is an empty message list"):
        RLHFDataset(path, tokenizer, apply_chat_template=False)
    with caplog.at_level(logging.WARNING, logger="hybrid_rl.data.bad_rows"):
        data = RLHFDataset(path, tokenizer, apply_chat_template=False, bad_rows="skip")
    assert len(data) == 199 and "left out 1 of 200 prompt rows" in caplog.text and "1 prompt is an empty" in caplog.text


def test_verl_sft_dict_keys(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "extra_info": {"question": f"q{i}", "answer": f"a{i} #### {i}"}}
            for i in range(3)]
    rows.append({"data_source": "openai/gsm8k", "extra_info": {"question": "q3"}})
    path = _write(tmp_path / "train.jsonl", rows, "jsonl")
    keys = dict(prompt_key="extra_info", response_key="extra_info", prompt_dict_keys=["question"],
                response_dict_keys=["answer"])
    with pytest.raises(ValueError, match=r"row 4: 'extra_info' has no field 'answer' .*data.response_dict_keys"):
        load_sft_examples(path, **keys)
    policy = BadRows("skip", 0.5, what="SFT rows")
    examples = load_sft_examples(path, **keys, bad_rows=policy)
    assert [e.messages for _, _, e in examples][1] == [{"role": "user", "content": "q1"},
                                                       {"role": "assistant", "content": "a1 #### 1"}]
    assert policy.skipped == [(path, "row 4", "no extra_info.answer")]


def test_config_accepts_folders_and_globs_and_checks_the_policy(tmp_path):
    from hybrid_rl.trainer.config.checks import validate_config
    from hybrid_rl.trainer.config.loader import get_config, to_ppo_config

    (tmp_path / "train").mkdir()
    _write(tmp_path / "train" / "part-0.jsonl.gz", ROWS, "jsonl")
    _write(tmp_path / "test.json", ROWS, "array")

    def problems(*overrides):
        try:
            validate_config(to_ppo_config(get_config([f"data.arithmetic.cache_dir={tmp_path}", *overrides])))
        except ValueError as error:
            return [line for line in str(error).splitlines() if "data." in line]
        return []

    assert problems(f"data.train_files={tmp_path}/train", f"data.val_files={tmp_path}/*.json",
                    "data.bad_rows=skip", "data.max_bad_fraction=0.05") == []
    (line,) = problems(f"data.train_files={tmp_path}/train", "data.bad_rows=drop")
    assert "data.bad_rows='drop' must be one of ('error', 'skip')" in line
    (line,) = problems(f"data.train_files={tmp_path}/nothing-*.parquet")
    assert "data.train_files: data files" in line and "matches no file" in line
