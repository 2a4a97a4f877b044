"""Every entry point speaks the same way: --help lists its keys with their documentation, --cfg job
prints the resolved config, and eval/debug check only what they use."""

import pytest

from hybrid_rl.trainer import main_ppo, main_rm, main_sft
from hybrid_rl.trainer.config.checks import validate_config
from hybrid_rl.trainer.config.loader import get_config, to_ppo_config


@pytest.fixture(autouse=True)
def _fresh_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_main_ppo_help_lists_every_key_with_its_value_documentation_and_registry(capsys):
    main_ppo.main(["--help", "data.train_batch_size=8"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m hybrid_rl.trainer.main_ppo")
    assert "  data.train_batch_size=8\n      Prompts per training step" in out  # the override shows
    assert "(each is sampled ``rollout.n`` times).\n      range: >= 1\n" in out  # its declared range
    assert "  actor_rollout_ref.actor.grad_clip=1.0\n" in out and "      range: > 0 or null\n" in out
    assert "  actor_rollout_ref.rollout.response_length=${data.max_response_length}" in out  # a linked key
    assert "- gae [needs critic]: Generalised Advantage Estimation" in out
    assert "- decoupled [needs rollout log probs]" in out
    assert out.count("\n  trainer.") >= 30 and "[actor_rollout_ref.rollout.val_kwargs]" in out


@pytest.mark.parametrize("module, own_keys", [
    (main_sft, ["  optim.lr=1e-05\n      Peak learning rate.", "  data.response_key=response", "  rollout.n=1"]),
    (main_rm, ["  data.micro_batch_size_per_gpu=8\n      Pairs per forward/backward", "  data.chosen_key=chosen"]),
])
def test_sft_and_rm_help_list_only_their_own_keys(module, own_keys, tmp_path, capsys):
    module.main(["--help", f"data.arithmetic.cache_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m hybrid_rl.trainer.{module.__name__.rsplit('.', 1)[1]}")
    assert all(key in out for key in own_keys), out[:3000]
    assert "model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "actor_rollout_ref" not in out and "algorithm." not in out and "critic." not in out  # no PPO keys
    assert not (tmp_path / "checkpoints").exists()  # nothing ran


def test_sft_cfg_job_prints_the_resolved_config_and_bad_flags_are_one_line(tmp_path, capsys):
    main_sft.main(["--cfg", "job", "optim.lr=3e-5", f"data.arithmetic.cache_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert "lr: 3.0e-05" in out and "partial_pretrain: HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "response_length: 16" in out and "experiment_name: sft" in out  # resolved: linked keys and defaults
    with pytest.raises(SystemExit) as exit_info:
        main_rm.main(["--verbose"])
    assert exit_info.value.code == 2
    assert "unknown flag(s) ['--verbose']" in capsys.readouterr().err


def test_sft_and_rm_read_a_yaml_config_as_main_ppo_does(tmp_path, capsys):
    """``--config-path DIR --config-name NAME``: the YAML names the mode's schema; the command line wins."""
    (tmp_path / "my_rm.yaml").write_text("defaults:\n  - rm_trainer_schema\n  - _self_\n"
                                         "data:\n  chosen_key: better\n  train_batch_size: 4\noptim:\n  lr: 2.0e-05\n")
    main_rm.main(["--config-path", str(tmp_path), "--config-name", "my_rm", "optim.lr=3e-5", "--cfg", "job"])
    out = capsys.readouterr().out
    assert "chosen_key: better" in out and "train_batch_size: 4" in out and "lr: 3.0e-05" in out
    (tmp_path / "bare.yaml").write_text("data:\n  chosen_key: better\n")
    with pytest.raises(SystemExit):
        main_rm.main([f"--config-path={tmp_path}", "--config-name=bare", "--cfg", "job"])
    assert "does not name its schema" in capsys.readouterr().err


def test_eval_and_debug_check_only_what_they_use():
    """A batch that no mini-batch divides is refused for training but fine for generating and scoring."""
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

    cfg = to_ppo_config(get_config(["data.train_batch_size=4"]))
    with pytest.raises(ValueError, match=r"multiple of actor_rollout_ref.actor.ppo_mini_batch_size \(16\)"):
        validate_config(cfg)
    validate_config(cfg, training=False)
    trainer = RayPPOTrainer(cfg, for_training=False)
    assert trainer.step_plan()[0] == "generate" and trainer.workers is None
    with pytest.raises(ValueError, match="response_length=8 differs"):  # what generation uses is still checked
        validate_config(to_ppo_config(get_config(["actor_rollout_ref.rollout.response_length=8"])), training=False)


def test_debug_and_eval_help_point_at_the_config_keys(capsys):
    from hybrid_rl import debug, eval as eval_cli

    for module in (debug, eval_cli):
        with pytest.raises(SystemExit) as exit_info:
            module.main(["--help"])
        assert exit_info.value.code == 0
        assert "main_ppo --help" in " ".join(capsys.readouterr().out.split())
