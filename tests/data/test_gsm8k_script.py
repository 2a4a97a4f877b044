"""scripts/data/gsm8k.py: veRL preprocessing semantics, errors, and the real shared GSM8K files."""

import importlib.util
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybrid_rl.data import RLHFDataset
from hybrid_rl.utils.testing import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


@pytest.fixture(scope="module")
def gsm8k():
    spec = importlib.util.spec_from_file_location("gsm8k_script", REPO / "scripts" / "data" / "gsm8k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    with pytest.raises(ValueError, match="exactly one of --input_dir"):
        gsm8k.convert(tmp_path / "out")
    with pytest.raises(SystemExit):  # argparse: the two sources are mutually exclusive
        gsm8k.main(["--input_dir", "a", "--hf_dataset", "b"])
    # Offline test machine: either `datasets` is missing or the hub is unreachable; both say what to do.
    with pytest.raises(RuntimeError, match="--input_dir"):
        gsm8k.convert(tmp_path / "out", hf_dataset="openai/gsm8k", splits=["test"])


@pytest.mark.skipif(not (SHARED_GSM8K / "train.jsonl").is_file(),
                    reason=f"shared GSM8K copy not found at {SHARED_GSM8K} (needs train.jsonl/test.jsonl)")
def test_real_gsm8k_files(gsm8k, tmp_path):
    paths = gsm8k.main(["--input_dir", str(SHARED_GSM8K), "--output_dir", str(tmp_path)])
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
