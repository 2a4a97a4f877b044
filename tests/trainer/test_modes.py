"""The modes' table and its one command-line path: a row is all a mode needs to get a command."""

import sys

import pytest

from hybrid_rl.trainer import modes
from hybrid_rl.trainer.config.loader import SFT_SCHEMA
from hybrid_rl.trainer.modes import MODES, ModeSpec, get_mode, parse_args, register_mode, run_mode


@pytest.fixture(autouse=True)
def _fresh_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_each_row_names_a_schema_a_trainer_and_its_command():
    assert sorted(MODES) == ["dpo", "ppo", "rm", "sft"]
    for name, spec in MODES.items():
        assert spec.entry_module == f"hybrid_rl.trainer.main_{name}" and spec.schema.module == f"main_{name}"
        assert spec.resolve("trainer").__name__ == {"ppo": "RayPPOTrainer", "sft": "SFTTrainer", "rm": "RMTrainer",
                                               "dpo": "DPOTrainer"}[name]
        assert callable(spec.resolve("validate")) and spec.description.endswith(".") and spec.default_task


def test_a_name_is_registered_once_and_an_unknown_one_is_one_line():
    with pytest.raises(ValueError, match=r"mode 'sft' is registered already \(hybrid_rl.trainer.main_sft\)"):
        register_mode(MODES["sft"])
    with pytest.raises(ValueError, match=r"unknown mode 'kto'; the modes are \['dpo', 'ppo', 'rm', 'sft'\]"):
        get_mode("kto")


def test_a_new_row_gets_help_cfg_job_and_one_line_errors(request, capsys, tmp_path):
    """A mode added by its row alone speaks as the others (here SFT's schema under another name)."""
    spec = ModeSpec("toy", SFT_SCHEMA, "hybrid_rl.trainer.sft.trainer:SFTTrainer", "hybrid_rl.trainer.main_toy",
                    "nothing", "Toy training.", "(veRL's SFT trainer names)",
                    "hybrid_rl.trainer.config.supervised_checks:validate_supervised_config", starts_ray=False)
    register_mode(spec)
    request.addfinalizer(lambda: modes._MODES.unregister("toy"))
    run_mode("toy", ["--help", f"data.arithmetic.cache_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m hybrid_rl.trainer.main_toy [key=value ...] [--cfg job]")
    assert "\nToy training. Every key below is set as key=value (veRL's SFT trainer names)" in out
    assert "no model is loaded).\n" in out and "Registries (" not in out
    run_mode("toy", ["--cfg", "job", "optim.lr=2e-5", f"data.arithmetic.cache_dir={tmp_path}"])
    assert "lr: 2.0e-05" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        run_mode("toy", ["optim.lr=-1", "--cfg", "job"])
    assert exit_info.value.code == modes.CONFIG_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("hybrid_rl config error: ") and err.count("\n") == 1 and "optim.lr" in err


def test_ppo_help_ends_with_every_registry(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["main_ppo"])  # run_mode(argv) sets it for Hydra's runner
    run_mode("ppo", ["--help"])
    out = capsys.readouterr().out
    assert "\nRegistries (pick an entry by its name" in out and "  rollout engine (actor_rollout_ref.rollout.name):" in out
    assert "      - grpo [needs groups]: GRPO outcome advantage" in out  # under its key, as before


def test_parse_args_splits_settings_options_and_flags():
    assert parse_args(["a=1", "--cfg", "job", "-cn=x", "--verbose", "+b.c=2"]) == (
        ["a=1", "+b.c=2"], {"--cfg": "job", "--config-name": "x"}, ["--verbose"])
    with pytest.raises(ValueError, match=r"cannot parse 'lr': write key=value"):
        parse_args(["lr"])
