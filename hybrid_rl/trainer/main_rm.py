"""Reward-model training: ``python -m hybrid_rl.trainer.main_rm [key=value ...]`` on preference pairs.

    python -m hybrid_rl.trainer.main_rm                                   # arithmetic pairs, generated
    python -m hybrid_rl.trainer.main_rm data.train_files=pairs_train.parquet data.val_files=pairs_test.parquet \\
        model.partial_pretrain=checkpoints/sft/hf optim.lr=1e-5 trainer.total_epochs=2
    python -m hybrid_rl.model_merger --local_dir .../global_step_N/reward_model --target_dir rm_hf

The keys are ``main_sft``'s (veRL's SFT names) applied to the reward model, which is trained on the
critic's worker: ``model.partial_pretrain`` (the backbone, usually the SFT model) is
``critic.model.path``, ``optim.*`` the critic's optimizer, ``data.micro_batch_size_per_gpu`` pairs
per forward/backward (``RM_KEY_MAP``); ``data.chosen_key`` / ``rejected_key`` / ``margin_key`` /
``prompt_key`` name the columns (OpenRLHF's ``--chosen_key`` ...; HH-RLHF, UltraFeedback and TRL
shapes are read as they are, :mod:`hybrid_rl.data.preference`), ``data.max_length`` and
``data.truncation`` bound a rendered conversation. One optimizer step per ``data.train_batch_size``
pairs; checkpoints, resume, trackers and the plot are the RL trainer's. Without
``data.train_files`` it trains on the arithmetic task's preference pairs
(:mod:`hybrid_rl.data.rlhf_data`) and validates on the 200 held-out problems' pairs.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from hybrid_rl.trainer.main_sft import ModeHelp, default_data_files, run_cli, translate_overrides, typed_config

__all__ = ["RM_KEY_MAP", "main", "rm_config", "rm_overrides", "run_rm"]

RM_KEY_MAP = {
    "model.partial_pretrain": "critic.model.path",
    "model.enable_gradient_checkpointing": "critic.model.enable_gradient_checkpointing",
    "model.trust_remote_code": "critic.model.trust_remote_code",
    "model.use_remove_padding": "critic.model.use_remove_padding",
    "optim.lr": "critic.optim.lr",
    "optim.weight_decay": "critic.optim.weight_decay",
    "optim.betas": "critic.optim.betas",
    "optim.warmup_steps_ratio": "critic.optim.lr_warmup_steps_ratio",
    "optim.lr_scheduler": "critic.optim.lr_scheduler_type",
    "optim.clip_grad": "critic.grad_clip",
    "data.micro_batch_size_per_gpu": "critic.ppo_micro_batch_size_per_gpu",
}
"""veRL SFT-style key -> the trainer's key (the reward model lives in the ``critic`` section)."""

RM_FIXED = ["critic.rollout_n=1", "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.use_kl_loss=false",
            "algorithm.use_kl_in_reward=false", "algorithm.adv_estimator=reinforce_plus_plus"]
RM_DEFAULTS = {"trainer.experiment_name": "reward_model", "critic.optim.lr": "1e-5",
               "critic.ppo_micro_batch_size_per_gpu": "8", "trainer.total_training_steps": "null",
               "trainer.total_epochs": "1"}
BATCH_KEYS = ["critic.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"]


def rm_overrides(argv: Sequence[str]) -> list[str]:
    """The trainer's overrides for a reward-model command line (see the module docstring)."""
    out, given = translate_overrides(argv, RM_KEY_MAP, RM_DEFAULTS, RM_FIXED, BATCH_KEYS)
    if "data.train_batch_size" not in given:  # the default batch: one optimizer step per batch
        from hybrid_rl.trainer.config.loader import get_config

        size = get_config(out).data.train_batch_size
        out += [f"{k}={size}" for k in BATCH_KEYS]
    paths = [arg.partition("=")[2] for arg in out if arg.partition("=")[0] == "critic.model.path"]
    if paths:  # the tokenizer (and the parameter count) follow the reward model's backbone
        out.append(f"actor_rollout_ref.model.path={paths[-1]}")
    if "data.train_files" not in given:
        out += default_data_files(out, ("pairs_train", "pairs_test"))
    return out


def rm_config(argv: Sequence[str]):
    """The typed config of a reward-model command line (unknown keys: one line naming the nearest)."""
    return typed_config(rm_overrides(argv))


def run_rm(argv: Sequence[str] = ()) -> dict[str, float]:
    """Train a reward model from ``key=value`` arguments (a notebook's entry); returns the last step's metrics."""
    return _run(rm_config(argv))


def _run(config) -> dict[str, float]:
    from hybrid_rl.trainer.rm_trainer import RMTrainer
    from hybrid_rl.trainer.core.supervisor import run_supervised

    return run_supervised(RMTrainer(config), RMTrainer)


def main(argv: Optional[list[str]] = None) -> None:
    run_cli(sys.argv[1:] if argv is None else argv, rm_config, _run,
            ModeHelp("main_rm", "Reward-model training on preference pairs (Bradley-Terry), veRL's SFT keys applied "
                     "to the reward model.", RM_KEY_MAP))


if __name__ == "__main__":
    main()
