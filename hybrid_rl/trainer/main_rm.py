"""Reward-model training: ``python -m hybrid_rl.trainer.main_rm [key=value ...]`` on preference pairs.

    python -m hybrid_rl.trainer.main_rm                                   # arithmetic pairs, generated
    python -m hybrid_rl.trainer.main_rm data.train_files=pairs_train.parquet data.val_files=pairs_test.parquet \\
        model.partial_pretrain=checkpoints/sft/hf optim.lr=1e-5 trainer.total_epochs=2
    python -m hybrid_rl.model_merger --local_dir .../global_step_N/reward_model --target_dir rm_hf

The keys are :class:`~hybrid_rl.trainer.config.supervised.RMConfig`'s: veRL's SFT names applied to
the reward model (``model.partial_pretrain``: the backbone, usually the SFT model; ``optim.*``;
``data.micro_batch_size_per_gpu``: pairs per forward/backward), ``data.chosen_key`` /
``rejected_key`` / ``margin_key`` / ``prompt_key`` for the columns (OpenRLHF's ``--chosen_key`` ...;
HH-RLHF, UltraFeedback and TRL shapes are read as they are, :mod:`hybrid_rl.data.preference`), and
``data.max_length`` / ``data.truncation`` bounding a rendered conversation. One optimizer step per
``data.train_batch_size`` pairs (:class:`~hybrid_rl.trainer.rm.trainer.RMTrainer`); checkpoints,
resume, trackers and the plot are the trainer core's. Without ``data.train_files`` it trains on the
arithmetic task's preference pairs (:mod:`hybrid_rl.data.rlhf_data`) and validates on the 200
held-out problems' pairs.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hybrid_rl.trainer.modes import MODES, compose, run_config, run_mode

__all__ = ["RM_MODE", "main", "run_rm", "rm_config"]

RM_MODE = MODES["rm"]
"""This command's row of :data:`hybrid_rl.trainer.modes.MODES`."""


def rm_config(argv: Sequence[str] = ()):
    """The typed :class:`RMConfig` of ``key=value`` arguments (unknown keys: one line naming the nearest)."""
    return compose(RM_MODE, argv)


def run_rm(argv: Sequence[str] = ()) -> dict[str, float]:
    """Train a reward model from ``key=value`` arguments (a notebook's entry); returns the last step's metrics."""
    return run_config("rm", rm_config(argv))


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_rm [key=value ...]``."""
    run_mode("rm", argv)


if __name__ == "__main__":
    main()
