"""Bad input end to end: every user mistake ends the CLI with ONE actionable line, no traceback, exit 2.

Each case runs the real entry point ``hybrid_rl.trainer.main_ppo``: most in-process through
``main_ppo.main(argv)`` (same code path, without ~8 s of imports per case), a few as real
subprocesses, including one error raised inside a Ray worker (unwrapped from ``RayTaskError``).
The asserted lines are listed in docs/reliability.md ("Bad input").
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from hybrid_rl.trainer import main_ppo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "hybrid_rl config error: "


@dataclass
class Env:
    """Where a case may write its files, and the tiny model."""

    tmp: str
    model: str

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def jsonl(self, name: str, rows: list[dict]) -> str:
        return self.write(name, "".join(json.dumps(r) + "\n" for r in rows))


def _row(i: int, **changes) -> dict:
    row = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
           "reward_model": {"style": "rule", "ground_truth": str(i + 1)}}
    row.update(changes)
    return row


def _good_rows(**changes) -> list[dict]:
    return [_row(i, **changes) for i in range(8)]


def base_overrides(env: Env) -> list[str]:
    """A small valid GRPO run on 2 CPU workers (each case breaks one thing)."""
    return [
        f"actor_rollout_ref.model.path={env.model}",
        f"data.train_files={env.jsonl('good.jsonl', _good_rows())}",
        "data.max_prompt_length=160",
        "data.max_response_length=8",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=1",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={env.tmp}/run",
        "ray_init.num_cpus=2",
    ]


# ----------------------------------------------------------------------------- the cases
# Each case: (overrides added to the base run, substrings the last stderr line must contain).
Case = Callable[[Env], tuple[list[str], list[str]]]
CASES: dict[str, Case] = {}


def case(name: str):
    def decorator(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return decorator


@case("unknown_key")
def _(env):
    return ["data.train_bach_size=4"], ["Unknown config key 'data.train_bach_size'", "Did you mean 'data.train_batch_size'"]


@case("wrong_type")
def _(env):
    return ["data.train_batch_size=four"], [
        "data.train_batch_size: Value 'four'", "converted to Integer", "Fix: give data.train_batch_size a value"]


@case("malformed_override")
def _(env):
    return ["data.train_files=[a.jsonl"], ["cannot parse the override 'data.train_files=[a.jsonl'", "Fix: write key=value"]


@case("batch_not_divisible")
def _(env):
    return (["data.train_batch_size=3", "actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
            ["= 9 rows is not divisible by the 2 workers", "change the batch size or the worker count"])


@case("token_budget_below_longest_row")
def _(env):
    return (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"],
            ["ppo_max_token_len_per_gpu=100 is smaller than one row of up to", "raise it to at least"])


@case("grpo_with_n_1")
def _(env):
    return ["actor_rollout_ref.rollout.n=1"], ["adv_estimator=grpo", "rollout.n=1", "set rollout.n >= 2"]


@case("missing_data_file")
def _(env):
    return [f"data.train_files={env.tmp}/nope.parquet"], ["data.train_files", "nope.parquet' does not exist", "fix the path"]


@case("empty_data_file")
def _(env):
    return [f"data.train_files={env.write('empty.jsonl', '')}"], ["empty.jsonl' contains no rows", "fill it or remove it"]


@case("unreadable_data_file")
def _(env):
    return [f"data.train_files={env.write('junk.parquet', 'not parquet at all')}"], [
        "junk.parquet' is not a readable parquet file", "Fix: re-write it"]


@case("parquet_missing_column")
def _(env):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in _good_rows()]
    path = os.path.join(env.tmp, "no_reward.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return [f"data.train_files={path}"], ["no_reward.parquet' has no column 'reward_model'", "add a 'reward_model' column"]


@case("empty_prompt_row")
def _(env):
    rows = _good_rows()
    rows[3]["prompt"] = [{"role": "user", "content": "  "}]
    return [f"data.train_files={env.jsonl('blank.jsonl', rows)}"], [
        "blank.jsonl' row 4: field 'prompt' has no text", "fix or remove the row"]


@case("missing_ground_truth_row")
def _(env):
    rows = _good_rows()
    rows[5]["reward_model"] = {"style": "rule"}
    return [f"data.train_files={env.jsonl('no_gt.jsonl', rows)}"], [
        "no_gt.jsonl' row 6: field 'reward_model.ground_truth' is missing", "fix or remove the row"]


@case("all_prompts_too_long")
def _(env):
    return ["data.max_prompt_length=5"], ["all 8 prompts are longer than max_prompt_length=5", "raise data.max_prompt_length"]


@case("unknown_data_source")
def _(env):
    path = env.jsonl("unknown_source.jsonl", _good_rows(data_source="my_task"))
    return [f"data.train_files={path}"], [
        "no reward function for data_source 'my_task'", "unknown_source.jsonl", "custom_reward_function.path"]


@case("custom_reward_path_missing")
def _(env):
    return [f"custom_reward_function.path={env.tmp}/reward_nope.py"], [
        "custom_reward_function.path=", "reward_nope.py' does not exist", "point it at a .py file"]


@case("custom_reward_function_missing")
def _(env):
    path = env.write("reward_other_name.py", "def my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                             "    return 1.0\n")
    return [f"custom_reward_function.path={path}", "custom_reward_function.name=compute_score"], [
        "custom_reward_function.name 'compute_score' not found", "functions defined there: ['my_score']; set custom_reward_function.name"]


@case("custom_reward_wrong_signature")
def _(env):
    path = env.write("reward_bad_sig.py", "def compute_score(text):\n    return 1.0\n")
    return [f"custom_reward_function.path={path}"], [
        "cannot be called with the keyword arguments", "def compute_score(data_source, solution_str, ground_truth"]


@case("unknown_adv_estimator")
def _(env):
    return ["algorithm.adv_estimator=gpro"], ["algorithm.adv_estimator='gpro' is not registered; valid:", "'grpo'"]


@case("unknown_loss_mode")
def _(env):
    return ["actor_rollout_ref.actor.policy_loss.loss_mode=ppo2"], [
        "policy_loss.loss_mode='ppo2' is not registered; valid:", "'vanilla'"]


@case("unknown_kl_penalty")
def _(env):
    return ["algorithm.kl_penalty=k9"], ["algorithm.kl_penalty='k9' is not one of", "'low_var_kl'", "set one of them"]


@case("unknown_kl_loss_type")
def _(env):
    return ["actor_rollout_ref.actor.kl_loss_type=k9"], ["actor.kl_loss_type='k9' is invalid", "low_var_kl"]


@case("model_path_missing")
def _(env):
    return [f"actor_rollout_ref.model.path={env.tmp}/no_model"], [
        "actor_rollout_ref.model.path=", "no_model' is not a local HF model folder", "fix the path"]


@case("model_not_causal_lm")
def _(env):
    # A seq2seq T5 folder (BERT would pass: HF maps it to BertLMHeadModel).
    env.write("t5/config.json", json.dumps({"model_type": "t5", "d_model": 8}))
    return [f"actor_rollout_ref.model.path={env.tmp}/t5"], [
        "holds a 't5' model, which is not a causal language model", "use a decoder-only LM folder"]


@case("tokenizer_without_chat_template")
def _(env):
    folder = os.path.join(env.tmp, "no_template")
    shutil.copytree(env.model, folder)
    os.remove(os.path.join(folder, "chat_template.jinja"))
    config_file = os.path.join(folder, "tokenizer_config.json")
    tok_config = json.load(open(config_file))
    tok_config.pop("chat_template", None)
    json.dump(tok_config, open(config_file, "w"))
    return [f"actor_rollout_ref.model.path={folder}"], ["tokenizer has no chat_template", "use an instruct/chat model"]


def _multi_turn(tools_yaml: str) -> list[str]:
    return ["actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools_yaml}"]


@case("unknown_tool_class")
def _(env):
    path = env.write("tools_unknown.yaml", "tools:\n  - class_name: no_such_tool\n    config: {type: native}\n")
    return _multi_turn(path), ["tools_unknown.yaml' tools[0]: unknown tool class 'no_such_tool'",
                               "use a registered tool (calculator", "or the dotted path"]


@case("tool_yaml_does_not_parse")
def _(env):
    path = env.write("tools_broken.yaml", "tools:\n  - class_name: calculator\n   config: [\n")
    return _multi_turn(path), ["tool_config_path=", "tools_broken.yaml' is not valid YAML at line",
                               "check the indentation"]


@case("tool_schema_without_name")
def _(env):
    path = env.write("tools_schema.yaml", "tools:\n  - class_name: calculator\n    tool_schema: "
                     "{type: function, function: {description: x}}\n")
    return _multi_turn(path), ["tools[0]: tool_schema: the tool schema has no function.name",
                               "OpenAI function-calling schema"]


@case("tool_config_without_multi_turn")
def _(env):
    return ["actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml"], [
        "multi_turn.enable=False is invalid", "set actor_rollout_ref.rollout.multi_turn.enable=true to use them"]


@case("resume_path_not_a_checkpoint")
def _(env):
    os.makedirs(os.path.join(env.tmp, "some_folder"), exist_ok=True)
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={env.tmp}/some_folder"], [
        "some_folder is not a global_step_N folder", "point trainer.resume_from_path at one"]


@case("resume_with_other_worker_count")
def _(env):
    env.write("run/global_step_2/trainer_state.json", json.dumps({"global_step": 2, "world_size": 1}))
    env.write("run/latest_checkpointed_iteration.txt", "2")
    return ["trainer.resume_mode=auto"], [
        "saved by 1 workers but this run has 2", "own shard of the weights", "trainer.resume_mode=disable"]


@case("more_workers_than_cores")
def _(env):
    return ["trainer.n_gpus_per_node=4"], [
        "trainer.n_gpus_per_node=4 CPU workers but only 2 cores", "lower trainer.n_gpus_per_node"]


@case("ray_address_unreachable")
def _(env):
    return ["ray_init.address=127.0.0.1:1"], ["cannot reach the Ray cluster at '127.0.0.1:1'", "ray start --head"]


SUBPROCESS_CASES = ("unknown_key", "wrong_type")


# ----------------------------------------------------------------------------- runners
def _check_one_line(rc: int, err: str, expected: list[str]) -> str:
    """The contract; returns the error line."""
    assert rc == main_ppo.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert sum(ln.startswith(PREFIX) for ln in lines) == 1, err[-3000:]
    last = lines[-1]
    assert last.startswith(PREFIX), err[-3000:]
    for text in expected:
        assert text in last, f"{text!r} not in {last!r}"
    return last


@pytest.fixture
def env(tmp_path, tiny_model_dir) -> Env:
    return Env(str(tmp_path), tiny_model_dir)


@pytest.fixture
def run_in_process(env, monkeypatch, capsys):
    """``main_ppo.main(argv)`` in this process -> (exit status, stderr)."""
    monkeypatch.chdir(env.tmp)
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)  # main_ppo may set it

    def run(overrides: list[str]) -> tuple[int, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main_ppo.main(overrides)
        return exit_info.value.code, capsys.readouterr().err

    return run


def run_cli(env: Env, overrides: list[str], timeout: int = 600) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides]
    proc_env = dict(os.environ, PYTHONPATH=REPO)
    proc_env.pop("RAY_ADDRESS", None)
    result = subprocess.run(cmd, cwd=env.tmp, env=proc_env, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stderr


@pytest.mark.parametrize("name", [n for n in CASES if n not in SUBPROCESS_CASES])
def test_bad_input_in_process(name, env, run_in_process):
    extra, expected = CASES[name](env)
    rc, err = run_in_process(base_overrides(env) + extra)
    _check_one_line(rc, err, expected)


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_cli(name, env):
    extra, expected = CASES[name](env)
    _check_one_line(*run_cli(env, base_overrides(env) + extra), expected)


def test_base_config_is_valid(env):
    """Guards the cases: without the one broken thing the run passes every driver-side check."""
    trainer = main_ppo.build_trainer(main_ppo.get_config(base_overrides(env)))
    assert len(trainer.train_dataset) == 8


@pytest.mark.slow
def test_value_error_inside_a_ray_worker_is_one_line(env):
    """An error only the workers can see (an HF config override) is raised in ``init_model`` inside
    the Ray actors: the CLI unwraps the RayTaskError to its message, and Ray's 'Unhandled error'
    tracebacks of the other rank are not printed after it."""
    extra = ["+actor_rollout_ref.model.override_config.no_such_attr=1"]
    _check_one_line(*run_cli(env, base_overrides(env) + extra), [
        "model.override_config.no_such_attr=1: LlamaConfig has no attribute 'no_such_attr'", "remove it"])


# ----------------------------------------------------------------------------- Ray error unwrapping
def test_user_error_message_unwraps_ray_errors():
    from ray.exceptions import ActorDiedError, RayTaskError

    from hybrid_rl.single_controller.errors import WorkerGroupError

    cause = ValueError("model.path='x' does not exist; fix it")
    remote_tb = "Traceback (most recent call last):\n  File \"w.py\", line 1\nValueError: model.path='x' does not exist; fix it"
    task_error = RayTaskError("init_model", remote_tb, cause).as_instanceof_cause()
    assert main_ppo.user_error_message(task_error) == str(cause)
    died = ActorDiedError(RayTaskError("__init__", remote_tb, cause))
    assert died.actor_init_failed
    assert main_ppo.user_error_message(died) == str(cause)
    wrapped = WorkerGroupError("worker rank 0 died during `__init__`")
    wrapped.__cause__ = died
    assert main_ppo.user_error_message(wrapped) == str(cause)
    assert main_ppo.user_error_message(RuntimeError("a bug")) is None
    crash = ActorDiedError(RayTaskError("__init__", "Traceback...\nZeroDivisionError: division by zero", ZeroDivisionError()))
    assert main_ppo.user_error_message(crash) is None


def test_full_error_env_keeps_the_traceback(env, run_in_process, monkeypatch):
    """HYBRID_RL_FULL_ERROR=1: a late user error propagates (Hydra prints its traceback) instead."""
    monkeypatch.setenv(main_ppo.FULL_ERROR_ENV, "1")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match="cannot reach the Ray cluster"):
        main_ppo.main(base_overrides(env) + ["ray_init.address=127.0.0.1:1"])


# ----------------------------------------------------------------------------- custom reward security
def _scored(env: Env, reward_file: str, name: str = "compute_score") -> tuple[list[float], dict]:
    """Build the trainer's reward manager from the config and score two responses."""
    from hybrid_rl.trainer.ppo import inputs
    from hybrid_rl.trainer.config.loader import to_ppo_config
    from hybrid_rl.utils.testing import build_byte_tokenizer

    sys.path.insert(0, os.path.join(REPO, "tests", "reward"))
    try:
        from test_manager import make_batch
    finally:
        sys.path.pop(0)
    cfg = to_ppo_config(main_ppo.get_config(base_overrides(env) + [
        f"custom_reward_function.path={reward_file}", f"custom_reward_function.name={name}",
        "reward_model.timeout=5"]))
    tokenizer = build_byte_tokenizer()
    manager = inputs.build_reward_manager(cfg, tokenizer, num_examine=0)
    out = manager(make_batch(tokenizer, ["2", "3"], ["2", "3"]), return_dict=True)
    return out["reward_tensor"].sum(-1).tolist(), out["reward_metrics"]


def test_custom_reward_is_imported_only_from_the_named_path(env, monkeypatch):
    # A module of the same name sits in the working directory and on sys.path; it must never be used.
    shadow = env.write("shadow/my_reward.py", "def compute_score(**kw):\n    return -5.0\n")
    monkeypatch.syspath_prepend(os.path.dirname(shadow))
    monkeypatch.chdir(os.path.dirname(shadow))
    named = env.write("named/my_reward.py", textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0 if solution_str.strip() == ground_truth else 0.0
    """))
    path_before = list(sys.path)
    scores, _ = _scored(env, named)
    assert scores == [1.0, 1.0]
    assert sys.path == path_before and "my_reward" not in sys.modules
    # A named path that does not exist is an error, never a fallback to the module on sys.path.
    with pytest.raises(ValueError, match="does not exist"):
        _scored(env, os.path.join(env.tmp, "missing", "my_reward.py"))


def test_custom_reward_errors_stay_inside_the_guard(env):
    reward = env.write("raising_reward.py", textwrap.dedent("""
        import sys
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str.strip() == "2":
                raise RuntimeError("scorer bug")
            sys.exit(3)
    """))
    scores, metrics = _scored(env, reward)
    assert scores == [0.0, 0.0]
    assert metrics["reward/num_errors"] == 2 and metrics["reward/all_failed"] == 1.0
    assert np.isfinite(scores).all()


def test_deprecated_keys_are_plain_notices_before_the_error(env, run_in_process, capsys):
    """A deprecated veRL key is named in full, once, as a plain notice line on the console (as the
    other notices; not the warnings module's file:line and source line), before the one error line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # run_in_process's set-up; both streams read here
        main_ppo.main(base_overrides(env) + ["actor_rollout_ref.actor.ppo_micro_batch_size=2",
                                             "critic.optim.warmup_style=constant", "trainer.n_gpus_per_node=4"])
    out, err = capsys.readouterr()
    _check_one_line(exit_info.value.code, err, ["trainer.n_gpus_per_node=4 CPU workers"])
    lines = (out + err).splitlines()
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size", "critic.optim.warmup_style"):
        assert sum(f" {key} is deprecated " in f" {ln}" for ln in lines) == 1, out + err
    assert "Warning:" not in out + err, out + err
