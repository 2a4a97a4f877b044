"""scripts/data/gsm8k.py: veRL preprocessing semantics, where the rows come from (a local JSONL folder,
or datasets.load_dataset("openai/gsm8k", "main") as veRL's script), errors, and the real GSM8K."""

import json
import re
import sys

import gsm8k_data
from gsm8k_data import FakeDatasets
import pyarrow.parquet as pq
import pytest

from hybrid_rl.data import RLHFDataset
from hybrid_rl.utils.testing import build_byte_tokenizer

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


@pytest.fixture(scope="module")
def gsm8k():
    return gsm8k_data.script()


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))


def test_extract_solution(gsm8k):
    assert gsm8k.extract_solution("a <<2*3=6>>6\n#### 1,234") == "1234"
    assert gsm8k.extract_solution("#### -5") == "-5"
    assert gsm8k.extract_solution("#### 2.50") == "2.50"
    assert gsm8k.extract_solution("no final line") is None


def test_convert_small_folder(gsm8k, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write(src / "train.jsonl", [{"question": "Q1?", "answer": "step\n#### 72"},
                                {"question": "Q2?", "answer": "#### 1,000"}])
    write(src / "test.jsonl", [{"question": "T?", "answer": "#### 3"}])
    paths = gsm8k.main(["--input_dir", str(src), "--output_dir", str(tmp_path / "out")])
    train = pq.read_table(paths["train"]).to_pylist()
    assert train[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Q1? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": "step\n#### 72", "question": "Q1?"},
    }
    assert train[1]["reward_model"]["ground_truth"] == "1000" and train[1]["extra_info"]["index"] == 1
    assert len(pq.read_table(paths["test"])) == 1


def test_tool_agent_rows_load_with_the_calculator(gsm8k, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write(src / "train.jsonl", [{"question": "Q1?", "answer": "step\n#### 1,072"}])
    write(src / "test.jsonl", [{"question": "T?", "answer": "#### 3"}])
    paths = gsm8k.main(["--input_dir", str(src), "--output_dir", str(tmp_path / "out"), "--tool_agent"])
    (row,) = pq.read_table(paths["train"]).to_pylist()
    assert row["agent_name"] == "tool_agent" and row["prompt"][0]["role"] == "system"
    assert "calculator" in row["prompt"][0]["content"] and row["prompt"][1]["content"] == "Q1? " + INSTRUCTION
    assert row["extra_info"]["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": "1072"}}}
    item = RLHFDataset(paths["train"], build_byte_tokenizer(), max_prompt_length=4096)[0]
    assert item["agent_name"] == "tool_agent"


def test_verl_tool_rows_name_verls_answer_checking_tool(gsm8k, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write(src / "train.jsonl", [{"question": "Q1?", "answer": "#### 12"}])
    write(src / "test.jsonl", [{"question": "T?", "answer": "#### 3"}])
    paths = gsm8k.main(["--input_dir", str(src), "--output_dir", str(tmp_path / "out"), "--verl_tool"])
    (row,) = pq.read_table(paths["test"]).to_pylist()
    assert row["agent_name"] == "tool_agent" and "calc_gsm8k_reward" in row["prompt"][0]["content"]
    assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "3"}}}
    with pytest.raises(ValueError, match="at most one of --tool_agent"):
        gsm8k.convert(tmp_path / "x", input_dir=src, tool_agent=True, verl_tool=True)


@pytest.mark.parametrize("line,message", [
    ({"question": "Q?", "answer": "no marker"}, "field 'answer' has no final '#### <number>' line"),
    ({"answer": "#### 1"}, "field 'question' is missing"),
    ({"question": "Q?"}, "field 'answer' is missing"),
    ("{broken", "invalid JSON"),
    ("[1]", "expected a JSON object"),
])
def test_malformed_line_names_file_and_line(gsm8k, tmp_path, line, message):
    write(tmp_path / "train.jsonl", [{"question": "Q?", "answer": "#### 1"}, line])
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'train.jsonl'} line 2: ") + ".*" + re.escape(message)):
        gsm8k.convert(tmp_path / "out", input_dir=tmp_path, splits=["train"])


def test_source_errors(gsm8k, tmp_path):
    with pytest.raises(ValueError, match=r"test\.jsonl' not found"):
        gsm8k.convert(tmp_path / "out", input_dir=tmp_path, splits=["test"])
    with pytest.raises(ValueError, match=r"--input_dir '.*nowhere' is not a folder"):
        gsm8k.convert(tmp_path / "out", input_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="at most one of --input_dir"):
        gsm8k.convert(tmp_path / "out", input_dir=tmp_path, hf_dataset="openai/gsm8k")
    with pytest.raises(SystemExit):  # argparse: the two sources are mutually exclusive
        gsm8k.main(["--input_dir", "a", "--hf_dataset", "b"])


def test_without_input_dir_the_rows_come_from_datasets_as_in_verl(gsm8k, tmp_path, monkeypatch):
    fake = FakeDatasets({"train": [{"question": "Q1?", "answer": "step\n#### 1,072"}, {"question": "Q2?", "answer": "#### 5"}],
                         "test": [{"question": "T?", "answer": "#### -3"}]})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    paths = gsm8k.main(["--local_save_dir", str(tmp_path / "out")])
    assert fake.calls == [(("openai/gsm8k", "main"), {})]  # veRL's call, once for both splits
    train, test = pq.read_table(paths["train"]).to_pylist(), pq.read_table(paths["test"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["1072", "5"]
    assert train[1]["extra_info"] == {"split": "train", "index": 1, "answer": "#### 5", "question": "Q2?"}
    assert test[0]["prompt"] == [{"role": "user", "content": "T? " + INSTRUCTION}]
    gsm8k.convert(tmp_path / "other", hf_dataset="me/gsm8k_copy", splits=["test"])
    assert fake.calls[-1] == (("me/gsm8k_copy", "main"), {})


def test_hub_failures_say_how_to_get_the_data(gsm8k, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ValueError, match=r"needs the 'datasets' package .*pip install datasets, or pass --input_dir"):
        gsm8k.convert(tmp_path / "out")
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets(error=ConnectionError("Couldn't reach\n the hub")))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError) as info:
        gsm8k.convert(tmp_path / "out")
    assert str(info.value) == (
        "could not load 'openai/gsm8k' ('main') with datasets: it is not in the datasets cache and "
        "HF_DATASETS_OFFLINE=1 forbids the download (ConnectionError: Couldn't reach the hub). Fix: pass "
        "--input_dir <folder with train.jsonl and test.jsonl> (offline), or run once with network access to "
        "fill the datasets cache")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    with pytest.raises(SystemExit) as exit_info:  # the command line: one line, exit 2
        gsm8k.main(["--local_save_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("gsm8k.py: error: could not load 'openai/gsm8k' ('main') with datasets: the download failed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as in datasets: HF_DATASETS_OFFLINE, when set, decides
    assert gsm8k.hub_offline() is None
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    assert gsm8k.hub_offline() == "HF_HUB_OFFLINE=1"
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets({"train": []}))
    with pytest.raises(ValueError, match="'openai/gsm8k' has no split 'test'"):
        gsm8k.convert(tmp_path / "out", splits=["test"])


def test_the_suite_finds_gsm8k_as_a_clean_clone_would(monkeypatch, tmp_path):
    """GSM8K_DIR points the lookup at another folder (what a clone without ../shared sees): with nothing
    there and nothing cached, a test that needs GSM8K is skipped with the reason, never an error."""
    (tmp_path / "have").mkdir()
    for split in ("train", "test"):
        (tmp_path / "have" / f"{split}.jsonl").write_text("")
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path / "have"))
    assert gsm8k_data.source() == {"input_dir": str(tmp_path / "have")}
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets(error=FileNotFoundError("not cached")))
    with pytest.raises(pytest.skip.Exception, match=r"no GSM8K here: .*empty has no train.jsonl/test.jsonl \(set "
                                                    r"GSM8K_DIR .*\) and could not load 'openai/gsm8k'"):
        gsm8k_data.source()
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets({"train": [], "test": []}))
    assert gsm8k_data.source() == {}  # a cached hub copy: convert() reads it


def test_real_gsm8k_files(gsm8k, tmp_path):
    paths = gsm8k.convert(tmp_path, **gsm8k_data.source())  # a local copy, or openai/gsm8k from the cache
    train, test = pq.read_table(paths["train"]).to_pylist(), pq.read_table(paths["test"]).to_pylist()
    assert (len(train), len(test)) == (7473, 1319)
    assert [r["reward_model"]["ground_truth"] for r in train[:2]] == ["72", "10"]
    assert train[0]["prompt"][0]["content"].startswith("Natalia sold clips to 48 of her friends")
    for split, rows in (("train", train), ("test", test)):
        for i, row in enumerate(rows):
            float(row["reward_model"]["ground_truth"])  # every ground truth is a plain number
            assert row["prompt"][0]["content"].endswith(" " + INSTRUCTION)
            assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == split
            final = row["extra_info"]["answer"].split("####")[-1].strip().replace(",", "")
            assert final == row["reward_model"]["ground_truth"]
    ds = RLHFDataset(paths["test"], build_byte_tokenizer(), max_prompt_length=1024)
    assert len(ds) == 1319 and ds[0]["data_source"] == "openai/gsm8k"
