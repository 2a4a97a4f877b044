"""reasoning-gym as data and reward (hybrid_rl/hub/reasoning_gym.py): the rows, the scores on hand-made
responses, the reward registry's prefix route, the one-line errors, seeded and disjoint splits."""

import json
import sys

import pyarrow.parquet as pq
import pytest
from installed import import_installed

from hybrid_rl.hub import reasoning_gym as hub
from hybrid_rl.reward import default_compute_score, get_reward_fn, register_reward, unregister_reward
from hybrid_rl.reward.registry import check_data_sources

rg = import_installed("reasoning_gym", "envs")

LEGS = {"min_animals": 1, "max_animals": 2, "max_instances": 3}


def _generate(tmp_path, name="leg_counting", config=None, **kwargs):
    config = dict(LEGS if config is None else config)
    cfg = hub.ReasoningGymDataConfig(dataset=name, out_dir=str(tmp_path), config=config,
                                     **{"size": 6, "test_size": 4, **kwargs})
    train, test = hub.generate(cfg)
    return pq.read_table(train).to_pylist(), pq.read_table(test).to_pylist()


def _truth(answer: str, question: str = "How many legs do 2 cats have?") -> str:
    return json.dumps({"dataset": "leg_counting", "config": {},
                       "entry": {"question": question, "answer": answer, "metadata": {}}})


def test_rows_follow_the_layout_and_store_the_seeded_entry(tmp_path):
    train, test = _generate(tmp_path, seed=3)
    assert (len(train), len(test)) == (5, 4)  # size 6 minus the one demonstration
    dataset = rg.create_dataset("leg_counting", seed=3, size=100, **LEGS)
    for split, rows in (("train", train), ("test", test)):
        for i, row in enumerate(rows):
            assert row["data_source"] == "reasoning_gym/leg_counting"
            assert row["reward_model"]["style"] == "rule"
            assert [t["role"] for t in row["prompt"]] == ["user", "assistant", "user"]
            assert row["prompt"][-1]["content"].endswith("between <answer> and </answer>.")
            info = row["extra_info"]
            assert (info["split"], info["index"], info["dataset"], info["seed"]) == (split, i, "leg_counting", 3)
            truth = json.loads(row["reward_model"]["ground_truth"])
            assert truth["config"] == LEGS
            assert truth["entry"] == json.loads(json.dumps(dataset[info["dataset_index"]]))
            assert row["prompt"][-1]["content"].startswith(truth["entry"]["question"].rstrip())
    demo_question = train[0]["prompt"][0]["content"]
    assert train[0]["prompt"][1]["content"] == f"<answer>{_answer_of(demo_question, dataset)}</answer>"


def _answer_of(prompt: str, dataset) -> str:
    return next(e["answer"] for e in dataset if prompt.startswith(e["question"].rstrip()))


def test_same_seed_same_rows_other_seed_other_rows(tmp_path):
    first, again, other = (_generate(tmp_path / name, seed=seed) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    assert first == again
    assert [r["prompt"] for r in first[1]] != [r["prompt"] for r in other[1]]


def test_train_and_test_share_no_question(tmp_path):
    train, test = _generate(tmp_path, size=40, test_size=30)
    questions = {split: {json.loads(r["reward_model"]["ground_truth"])["entry"]["question"] for r in rows}
                 for split, rows in (("train", train), ("test", test))}
    assert len(questions["train"]) == 39 and len(questions["test"]) == 30  # distinct within each split too
    assert not questions["train"] & questions["test"]
    assert not any(test[0]["prompt"][0]["content"].startswith(q.rstrip()) for q in questions["test"])


@pytest.mark.parametrize("response, expected", [
    ("<answer>8</answer>", 1.0),                                  # right
    ("I think\n<answer> 8 </answer>", 1.0),                       # whitespace inside the tags is stripped
    ("<answer>6</answer>", 0.0),                                  # wrong
    ("<answer>8</answer> no wait <answer>6</answer>", 0.0),       # the last answer counts
    ("<answer>6</answer> no wait <answer>8</answer>", 1.0),
    ("<answer>8 legs</answer>", 1 / 6),                           # the base score_answer: len("8") / len("8 legs")
    ("8", 0.0),                                                   # no tags
    ("<answer>8", 0.0),                                           # unclosed
    ("", 0.0),
    (None, 0.0),                                                  # not even a string
])
def test_scores_on_hand_made_responses(response, expected):
    result = hub.compute_score("reasoning_gym/leg_counting", response, _truth("8"))
    assert result == {"score": pytest.approx(expected), "acc": 1.0 if expected == 1.0 else 0.0}


def test_a_scorer_that_raises_scores_zero(monkeypatch):
    def boom(answer, entry):
        raise RuntimeError("the task's parser choked")

    monkeypatch.setattr(hub, "_scorer", lambda name, config: boom)
    result = hub.compute_score("reasoning_gym/leg_counting", "<answer>8</answer>", _truth("8"))
    assert result == {"score": 0.0, "acc": 0.0}


def test_registry_routes_the_prefix_and_exact_names_win():
    route = get_reward_fn("reasoning_gym/leg_counting")
    assert get_reward_fn("reasoning_gym/basic_arithmetic") is route
    assert default_compute_score("reasoning_gym/leg_counting", "<answer>8</answer>", _truth("8")) == {"score": 1.0,
                                                                                                   "acc": 1.0}
    check_data_sources(["reasoning_gym/leg_counting"], warmup=True)
    with pytest.raises(ValueError, match="no reward function for data_source 'reasoning_gymX/leg_counting'"):
        get_reward_fn("reasoning_gymX/leg_counting")

    @register_reward("reasoning_gym/mine")
    def mine(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    try:
        assert default_compute_score("reasoning_gym/mine", "<answer>8</answer>", _truth("8")) == 0.5
    finally:
        unregister_reward("reasoning_gym/mine")


def test_unknown_dataset_is_one_line_naming_the_source_and_the_fix():
    with pytest.raises(ValueError) as err:
        hub.check_dataset_name("leg_countin")
    n = len(rg.factory.DATASETS)
    assert str(err.value) == (f"unknown reasoning-gym dataset 'leg_countin': did you mean ['leg_counting', "
                              f"'letter_counting', 'rectangle_count']? valid names are the {n} keys of "
                              f"reasoning_gym.factory.DATASETS (e.g. basic_arithmetic, leg_counting); pick one of them")


def test_library_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    with pytest.raises(ImportError) as err:
        hub.check_dataset_name("leg_counting")
    assert str(err.value) == ("reasoning-gym is not installed; install the optional environments with "
                              "`pip install -e .[envs]`")


def test_bad_config_and_bad_rows_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^reasoning-gym dataset 'leg_counting' rejected config \{'legs': 3\}: "
                                         r"TypeError: .*; its config fields are \['min_animals', "):
        hub.make_dataset("leg_counting", {"legs": 3})
    with pytest.raises(ValueError, match=r"^--config 'max_terms' is not key=value; write e.g. --config max_terms=2$"):
        hub.parse_config_items(["max_terms"])
    assert hub.parse_config_items(["a=2", 'b=["+","-"]', "c=simple"]) == {"a": 2, "b": ["+", "-"], "c": "simple"}
    with pytest.raises(ValueError, match=r"^config key 'seed' is set by this tool; pass --seed instead"):
        hub.ReasoningGymDataConfig(dataset="leg_counting", out_dir=".", config={"seed": 1})
    with pytest.raises(ValueError, match=r"gave only \d+ distinct questions in \d+ draws, fewer than size \+ "
                                         r"test_size = 1100; lower --size/--test_size or widen the config$"):
        _generate(tmp_path, config={"min_animals": 1, "max_animals": 1, "max_instances": 1}, size=1000, test_size=100)
    with pytest.raises(ValueError, match=r"^data_source 'reasoning_gym/leg_counting': reward_model.ground_truth is "
                                         r"not this adapter's JSON \(TypeError\); regenerate the rows with "):
        hub.compute_score("reasoning_gym/leg_counting", "<answer>8</answer>", "8")


def test_cli_writes_both_splits(tmp_path):
    train, test = hub.main(["--dataset", "leg_counting", "--out_dir", str(tmp_path), "--size", "5",
                            "--test_size", "3", "--num_shots", "0", "--config", "min_animals=1",
                            "--config", "max_animals=2", "--config", "max_instances=3"])
    rows = pq.read_table(test).to_pylist()
    assert len(pq.read_table(train).to_pylist()) == 5 and len(rows) == 3
    assert [t["role"] for t in rows[0]["prompt"]] == ["user"]
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["config"] == {"min_animals": 1, "max_animals": 2,
                                                                           "max_instances": 3}


def test_cli_bad_input_exits_with_its_one_line(tmp_path):
    with pytest.raises(SystemExit) as err:
        hub.main(["--dataset", "leg_counting", "--out_dir", str(tmp_path), "--config", "max_terms"])
    assert str(err.value) == "error: --config 'max_terms' is not key=value; write e.g. --config max_terms=2"
