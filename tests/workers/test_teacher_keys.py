"""Several distillation teachers: a training row whose ``distillation.teacher_key`` value matches no
teacher is refused on the driver before Ray starts (``preflight.check_teacher_keys``), in one line
naming the file and row (its line in JSON Lines), the value and the teachers; in the workers it would
stop only the ranks holding it (tests/workers/test_teacher_dist.py checks they all stop the same way)."""

import json
import sys

import pytest

from hybrid_rl.data import RLHFDataset
from hybrid_rl.trainer import main_ppo
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config
from hybrid_rl.trainer.ppo.preflight import check_teacher_keys
from hybrid_rl.utils.testing import build_byte_tokenizer
from tests.data.test_bad_data_main_ppo import PREFIX, run_main  # noqa: F401  (run_main: a fixture)

TEACHERS = ["+distillation.teacher_models.math={model_path:%s,key:gsm8k}",
            "+distillation.teacher_models.calc={model_path:%s,key:arithmetic}"]


def _row(source: str, agent: str = "a") -> str:
    return json.dumps({"data_source": source, "agent_name": agent, "prompt": [{"role": "user", "content": "1+1?"}],
                       "reward_model": {"style": "rule", "ground_truth": "2"}})


def _write(tmp_path, *lines: str, name: str = "train.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _cfg(model_dir: str, train_file: str, *extra: str):
    teachers = [t % model_dir for t in TEACHERS]
    return to_ppo_config(get_config([f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={train_file}",
                                     "distillation.enabled=true",
                                     "distillation.teacher_models.teacher_model.model_path=null", *teachers, *extra]))


def test_a_row_no_teacher_takes_is_named_by_file_and_line(tmp_path, tiny_model_dir):
    # line 1 gsm8k, line 2 blank, line 3 arithmetic, line 4 the orphan: "row 4" as an editor shows it
    path = _write(tmp_path, _row("gsm8k"), "", _row("arithmetic"), _row("orphan"))
    dataset = RLHFDataset(path, build_byte_tokenizer(), max_prompt_length=200)
    with pytest.raises(ValueError) as error:
        check_teacher_keys(_cfg(tiny_model_dir, path), dataset)
    assert str(error.value) == (
        f"data file {path!r} row 4: distillation.teacher_key data_source='orphan' matches no teacher (teachers: "
        "math (key 'gsm8k'), calc (key 'arithmetic')); fix the row's data_source, or add a teacher for it: "
        "+distillation.teacher_models.<name>={model_path:<folder>,key:orphan}")


def test_another_field_as_teacher_key_and_what_passes(tmp_path, tiny_model_dir):
    path = _write(tmp_path, _row("gsm8k", agent="gsm8k"), _row("gsm8k", agent="arithmetic"), name="a.jsonl")
    dataset = RLHFDataset(path, build_byte_tokenizer(), max_prompt_length=200)
    check_teacher_keys(_cfg(tiny_model_dir, path), dataset)  # data_source: every row is gsm8k's
    check_teacher_keys(_cfg(tiny_model_dir, path, "distillation.teacher_key=agent_name"), dataset)
    with pytest.raises(ValueError, match=rf"^data.train_files={path!r}: distillation.teacher_key='nope': the rows "
                                         r"have no such field \(they have \['ability', 'agent_name', 'data_source', "):
        check_teacher_keys(_cfg(tiny_model_dir, path, "distillation.teacher_key=nope"), dataset)
    other = _write(tmp_path, _row("gsm8k", agent="gsm8k"), _row("gsm8k", agent="chat"))
    with pytest.raises(ValueError, match=rf"^data file {other!r} row 2: distillation.teacher_key agent_name='chat' "):
        check_teacher_keys(_cfg(tiny_model_dir, other, "distillation.teacher_key=agent_name"),
                           RLHFDataset(other, build_byte_tokenizer(), max_prompt_length=200))


def test_one_teacher_takes_every_row(tmp_path, tiny_model_dir):
    path = _write(tmp_path, _row("orphan"))
    cfg = to_ppo_config(get_config([f"actor_rollout_ref.model.path={tiny_model_dir}", "distillation.enabled=true",
                                    f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}"]))
    check_teacher_keys(cfg, RLHFDataset(path, build_byte_tokenizer(), max_prompt_length=200))


def test_main_ppo_refuses_the_row_in_one_line_before_ray(tmp_path, tiny_model_dir, run_main):  # noqa: F811
    path = _write(tmp_path, *[_row(s) for s in ["gsm8k", "arithmetic"] * 2], "", _row("orphan"))
    ray = sys.modules.get("ray")
    was_up = ray is not None and ray.is_initialized()
    reward = tmp_path / "reward.py"  # scores every source, so the reward check passes the orphan row
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    rc, err = run_main(path, "distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=null",
                       *[t % tiny_model_dir for t in TEACHERS], f"custom_reward_function.path={reward}")
    assert rc == main_ppo.CONFIG_ERROR_EXIT_CODE and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith(f"{PREFIX}data file {path!r} row 6: distillation.teacher_key data_source='orphan' "
                                "matches no teacher (teachers: math (key 'gsm8k'), calc (key 'arithmetic'))"), lines
    if not was_up:
        assert sys.modules.get("ray") is None or not sys.modules["ray"].is_initialized()
