"""Dispatch by data source, @register_reward rules, and custom reward loading errors."""

import functools
import sys
import textwrap

import pytest

from hybrid_rl.reward import (
    default_compute_score,
    default_compute_score_batched,
    load_custom_reward_fn,
    register_reward,
    registered_data_sources,
    unregister_reward,
)
from hybrid_rl.reward.registry import check_data_sources


@pytest.fixture
def cleanup():
    names = []
    yield names
    unregister_reward(*names)


def test_builtin_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 72", "72") == 1.0
    assert default_compute_score("openai/gsm8k", "so 72", "72", method="flexible") == 1.0  # kwargs forwarded
    for source in ["math", "lighteval/MATH", "HuggingFaceH4/MATH-500", "DigitalLearningGmbH/MATH-lighteval"]:
        assert default_compute_score(source, r"\boxed{0.5}", r"\frac12") == 1.0
        assert default_compute_score(source, r"\boxed{0.6}", r"\frac12") == 0.0
    assert default_compute_score("arithmetic", "#### -3", -3) == 1.0
    assert default_compute_score_batched(["arithmetic", "openai/gsm8k"], ["#### 1", "#### 2"], [1, "3"], [None, None]) \
        == [1.0, 0.0]


def test_unknown_source_error_names_known_ones_and_the_fix():
    with pytest.raises(ValueError) as info:
        default_compute_score("my/unknown", "x", "y")
    msg = str(info.value)
    assert "'my/unknown'" in msg and "openai/gsm8k" in msg and "arithmetic" in msg
    assert "register_reward" in msg and "custom_reward_function" in msg
    with pytest.raises(ValueError, match="my/unknown"):
        check_data_sources(["arithmetic", "my/unknown"])


def test_register_and_duplicates(cleanup):
    cleanup += ["src_a", "src_b"]

    @register_reward("src_a", "src_b")
    def score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str == ground_truth), "source": data_source}

    assert default_compute_score("src_b", "x", "x") == {"score": 1.0, "source": "src_b"}
    assert {"src_a", "src_b"} <= set(registered_data_sources())

    def other(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    with pytest.raises(ValueError, match="already has the reward function.*override=True"):
        register_reward("src_a")(other)
    assert default_compute_score("src_a", "x", "x")["score"] == 1.0  # the failed registration changed nothing
    register_reward("src_a", override=True)(other)
    assert default_compute_score("src_a", "x", "x") == 0.5
    with pytest.raises(ValueError, match="openai/gsm8k"):
        register_reward("openai/gsm8k")(other)  # built-ins are protected the same way


def test_redefinition_of_same_function_replaces(cleanup):
    """Re-running a notebook cell defines a new function object with the same qualified name."""
    cleanup.append("nb_src")
    namespace = {}
    code = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return {value}\n"
    for value in (0.25, 0.75):
        exec(code.format(value=value), namespace)
        register_reward("nb_src")(namespace["score"])
    assert default_compute_score("nb_src", "x", "y") == 0.75


def test_register_rejects_bad_usage():
    def score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    with pytest.raises(ValueError, match="register_reward\\('my_source'\\)"):
        register_reward(score)
    with pytest.raises(ValueError, match="non-empty"):
        register_reward()
    with pytest.raises(ValueError, match="non-empty"):
        register_reward("")

    def two_args(solution, truth):
        return 1.0

    with pytest.raises(ValueError, match="cannot be called with the keyword arguments"):
        register_reward("bad_sig")(two_args)
    assert "bad_sig" not in registered_data_sources()


def _write(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


GOOD = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return float(solution_str == ground_truth) + bonus

    def helper():
        pass
"""


def test_load_custom_reward_fn(tmp_path):
    fn = load_custom_reward_fn(_write(tmp_path, GOOD), "compute_score")
    assert fn(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 1.0
    fn = load_custom_reward_fn(_write(tmp_path, GOOD), "compute_score", reward_kwargs={"bonus": 0.5})
    assert isinstance(fn, functools.partial)
    assert fn(data_source="d", solution_str="a", ground_truth="b", extra_info=None) == 0.5


def test_load_custom_reward_fn_imports_only_that_file(tmp_path, monkeypatch):
    """A same-named module on sys.path must not shadow the file the user named."""
    decoy_dir = tmp_path / "decoy"
    decoy_dir.mkdir()
    _write(decoy_dir, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return -1.0\n")
    monkeypatch.syspath_prepend(str(decoy_dir))
    first = load_custom_reward_fn(_write(tmp_path, GOOD), "compute_score")
    second = load_custom_reward_fn(_write(tmp_path, GOOD), "compute_score")
    assert first(data_source="d", solution_str="a", ground_truth="a") == 1.0
    assert first.__module__ != second.__module__  # unique module names per load
    assert first.__module__ in sys.modules and "my_reward" not in sys.modules


def test_load_custom_reward_fn_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_custom_reward_fn(str(tmp_path / "missing.py"), "compute_score")
    with pytest.raises(ValueError, match="does not exist or is not a file"):
        load_custom_reward_fn(str(tmp_path), "compute_score")
    with pytest.raises(ValueError, match="empty"):
        load_custom_reward_fn("", "compute_score")
    with pytest.raises(ValueError, match=r"'score_fn' not found .*\['compute_score', 'helper'\]"):
        load_custom_reward_fn(_write(tmp_path, GOOD), "score_fn")
    bad_sig = "def compute_score(text, answer):\n    return 1.0\n"
    with pytest.raises(ValueError, match=r"signature \(text, answer\).*data_source, solution_str"):
        load_custom_reward_fn(_write(tmp_path, bad_sig, "bad.py"), "compute_score")
    with pytest.raises(ValueError, match="reward kwargs \\['nope'\\]"):
        load_custom_reward_fn(_write(tmp_path, GOOD), "compute_score", reward_kwargs={"nope": 1})
    with pytest.raises(ValueError, match="failed to import: SyntaxError"):
        load_custom_reward_fn(_write(tmp_path, "def broken(:\n", "syntax.py"), "compute_score")
    with pytest.raises(ValueError, match="failed to import: ModuleNotFoundError"):
        load_custom_reward_fn(_write(tmp_path, "import no_such_module_xyz\n", "imp.py"), "compute_score")
    with pytest.raises(ValueError, match="not a function"):
        load_custom_reward_fn(_write(tmp_path, "compute_score = 3\n", "val.py"), "compute_score")


def test_load_custom_batched_signature(tmp_path):
    body = "def score(data_sources, solution_strs, ground_truths, extra_infos):\n    return [1.0] * len(solution_strs)\n"
    path = _write(tmp_path, body, "batched.py")
    assert load_custom_reward_fn(path, "score", batched=True)(
        data_sources=[1], solution_strs=["a"], ground_truths=[1], extra_infos=[None]) == [1.0]
    with pytest.raises(ValueError, match="data_source, solution_str"):
        load_custom_reward_fn(path, "score")  # per-sample signature expected by default
