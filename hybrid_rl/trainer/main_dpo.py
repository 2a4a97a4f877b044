"""Offline DPO: ``python -m hybrid_rl.trainer.main_dpo [key=value ...]`` on preference pairs.

    python -m hybrid_rl.trainer.main_dpo                                  # arithmetic pairs, generated
    python -m hybrid_rl.trainer.main_dpo data.train_files=pairs_train.parquet data.val_files=pairs_test.parquet \\
        model.partial_pretrain=checkpoints/sft/hf dpo.beta=0.1 dpo.loss_type=sigmoid optim.lr=1e-6
    python -m hybrid_rl.trainer.main_dpo --help                           # every key with its documentation

The keys are :class:`~hybrid_rl.trainer.dpo.config.DPOConfig`'s: veRL's SFT names (``data.*``,
``model.partial_pretrain``: the policy, usually the SFT model, whose frozen copy is the reference;
``optim.*``; ``trainer.*``), the pairs' columns (``data.chosen_key`` / ``rejected_key`` /
``prompt_key``; HH-RLHF, UltraFeedback and TRL shapes are read as they are,
:mod:`hybrid_rl.data.preference`), and TRL's DPO names under ``dpo.*`` (``beta``, ``loss_type``:
sigmoid | robust | hinge | ipo | simpo, ``label_smoothing``, ``simpo_gamma``, ``reference_free``).
Batch sizes count pairs. One optimizer step per ``data.train_batch_size`` pairs
(:class:`~hybrid_rl.trainer.dpo.trainer.DPOTrainer`); checkpoints, resume, trackers and the plot are
the trainer core's. Without ``data.train_files`` it trains on the arithmetic task's preference pairs
(:mod:`hybrid_rl.data.rlhf_data`) and validates on the 200 held-out problems: their pairs (the DPO
metrics) and their prompts (the greedy answers' accuracy).
"""

from __future__ import annotations

from typing import Optional, Sequence

from hybrid_rl.trainer.modes import MODES, compose, run_config, run_mode

__all__ = ["DPO_MODE", "dpo_config", "main", "run_dpo"]

DPO_MODE = MODES["dpo"]
"""This command's row of :data:`hybrid_rl.trainer.modes.MODES`."""


def dpo_config(argv: Sequence[str] = ()):
    """The typed :class:`DPOConfig` of ``key=value`` arguments (unknown keys: one line naming the nearest)."""
    return compose(DPO_MODE, argv)


def run_dpo(argv: Sequence[str] = ()) -> dict[str, float]:
    """Run a DPO job from ``key=value`` arguments (a notebook's entry); returns the last step's metrics."""
    return run_config("dpo", dpo_config(argv))


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_dpo [key=value ...]``."""
    run_mode("dpo", argv)


if __name__ == "__main__":
    main()
