"""Recipe presets: a recipe that runs another recipe with more overrides is that recipe's preset plus them."""

from pathlib import Path

from hybrid_rl.studio.presets import RECIPES_DIR, load_presets, recipe_overrides


def _recipe(root: Path, name: str, body: str) -> None:
    (root / name).mkdir()
    (root / name / "run.sh").write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)


def test_a_recipe_that_runs_another_appends_its_overrides(tmp_path):
    _recipe(tmp_path, "base", "python -m hybrid_rl.trainer.main_ppo \\\n    data.train_batch_size=16 \\\n"
                              "    trainer.total_training_steps=4 \\\n    \"$@\"\n")
    _recipe(tmp_path, "more", "# bash recipes/base/run.sh trainer.total_training_steps=9 (a comment)\n"
                              "exec bash recipes/base/run.sh \\\n    trainer.total_training_steps=8 \\\n    \"$@\"\n")
    _recipe(tmp_path, "other", "bash recipes/nothing_here/run.sh x=1\n")
    _recipe(tmp_path, "loop", "bash recipes/loop/run.sh x=1\n")
    presets = load_presets(tmp_path)
    assert presets["base"] == {"data.train_batch_size": 16, "trainer.total_training_steps": 4}
    assert presets["more"] == {"data.train_batch_size": 16, "trainer.total_training_steps": 8}  # the later one wins
    assert "other" not in presets and "loop" not in presets  # a recipe that cannot be read is left out


def test_the_online_dpo_recipe_is_the_default_run_plus_its_switch():
    words = recipe_overrides((RECIPES_DIR / "online_dpo_arithmetic" / "run.sh").read_text())
    base = recipe_overrides((RECIPES_DIR / "arithmetic_grpo" / "run.sh").read_text())
    assert words[:len(base)] == base
    assert words[len(base):] == ["actor_rollout_ref.actor.objective={name: dpo, beta: 0.1}",
                                 "trainer.total_training_steps=8", "trainer.save_freq=-1",
                                 "trainer.experiment_name=online_dpo_arithmetic"]
