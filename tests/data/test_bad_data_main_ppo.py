"""Unreadable data files end ``main_ppo`` in ONE line before Ray starts: the trainer builds its datasets
on the driver, and every unreadable line, mixed array or corrupt file is a ValueError naming the file
(and the line), which the entry point prints as ``hybrid_rl config error: ...`` with exit status 2."""

import gzip
import json
import sys

import pytest

from hybrid_rl.trainer import main_ppo

PREFIX = "hybrid_rl config error: "


def _row(i: int) -> dict:
    return {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)}}


def _jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _flipped_gzip() -> bytes:
    data = bytearray(gzip.compress(_jsonl(_row(i) for i in range(200)), mtime=0))
    for i in range(200, 210):  # in the deflate stream: a zlib error
        data[i] ^= 0xFF
    return bytes(data)


CASES = {  # file name, its bytes, the error line after the prefix and the file's path
    "invalid_json_line": ("bad.jsonl", _jsonl(_row(i) for i in range(4)) + b"{oops\n" + _jsonl([_row(5)]),
                          " line 5: invalid JSON (Expecting property name enclosed in double quotes at column 2); "
                          "fix or remove the line"),
    "not_utf8_line": ("latin1.jsonl", _jsonl([_row(0)]) + b"\n" + b'{"data_source": "caf\xe9"}\n',
                      " line 3: not UTF-8 text (byte 0xe9 at byte 21 of the line); re-save the file as UTF-8 or "
                      "remove the line"),
    "mixed_array": ("mixed.json", json.dumps([_row(0), _row(1), 7]).encode(),
                    " row 3: expected a JSON object (a row), got int; fix or remove the element"),
    "corrupt_gzip": ("flipped.jsonl.gz", _flipped_gzip(), " is corrupt (CRC/zlib error): Error -3 while decompressing "
                                                          "data: ...; re-download it or recompress it"),
}  # "...": zlib's own words (e.g. "invalid distance too far back"), which depend on the zlib build


@pytest.fixture
def run_main(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """``main_ppo.main`` in this process on a small valid run with ``data.train_files`` replaced."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)  # main_ppo may set it

    def run(train_file: str, *extra: str) -> tuple[int, str]:
        overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train_file}",
                     "data.max_prompt_length=160", "data.max_response_length=8", "data.train_batch_size=4",
                     "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=2",
                     "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path}/run",
                     "ray_init.num_cpus=2", *extra]
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main_ppo.main(overrides)
        return exit_info.value.code, capsys.readouterr().err

    return run


@pytest.mark.parametrize("name", list(CASES))
def test_unreadable_data_is_one_line_before_ray(tmp_path, run_main, name):
    file_name, content, message = CASES[name]
    path = tmp_path / file_name
    path.write_bytes(content)
    ray = sys.modules.get("ray")
    was_up = ray is not None and ray.is_initialized()
    rc, err = run_main(str(path))
    assert rc == main_ppo.CONFIG_ERROR_EXIT_CODE and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    head, _, tail = f"{PREFIX}data file {str(path)!r}{message}".partition("...")
    assert lines[-1] == head + tail or (tail and lines[-1].startswith(head) and lines[-1].endswith(tail)), lines[-1]
    assert sum(line.startswith(PREFIX) for line in lines) == 1
    if not was_up:  # the datasets are built on the driver, before the workers (and Ray) start
        assert sys.modules.get("ray") is None or not sys.modules["ray"].is_initialized()


def test_skip_passes_the_unreadable_line_and_the_next_check_speaks(tmp_path, run_main):
    """Under ``data.bad_rows=skip`` the invalid line is left out (1 of 6 rows is within
    ``max_bad_fraction=0.2``) and reported in the driver's log; the 5 good prompts then meet the next
    check, the batch size."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(CASES["invalid_json_line"][1])
    rc, err = run_main(str(path), "data.bad_rows=skip", "data.max_bad_fraction=0.2", "data.train_batch_size=8",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert rc == main_ppo.CONFIG_ERROR_EXIT_CODE, err[-3000:]
    log = (tmp_path / "run" / "logs" / "driver.log").read_text()
    assert ("hybrid_rl.data.bad_rows WARNING: data.bad_rows=skip: left out 1 of 6 prompt rows (16.67%) - 1 invalid "
            "JSON. First: bad.jsonl line 5: invalid JSON\n") in log
    assert err.strip().splitlines()[-1] == (f"{PREFIX}the training set has 5 prompts after filtering, fewer than "
                                            "data.train_batch_size=8; lower the batch size or add data")
