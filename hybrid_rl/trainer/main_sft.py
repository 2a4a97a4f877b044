"""Supervised fine-tuning: ``python -m hybrid_rl.trainer.main_sft [key=value ...]`` (veRL's SFT keys).

    python -m hybrid_rl.trainer.main_sft                                  # arithmetic SFT data, generated
    python -m hybrid_rl.trainer.main_sft data.train_files=sft_train.parquet data.val_files=sft_test.parquet \\
        data.prompt_key=prompt data.response_key=response model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \\
        optim.lr=1e-5 trainer.total_epochs=2
    python -m hybrid_rl.trainer.main_sft --help                           # every key with its documentation

The keys are :class:`~hybrid_rl.trainer.config.supervised.SFTConfig`'s (veRL's ``fsdp_sft_trainer``
names: ``data.*``, ``model.partial_pretrain``, ``optim.*``, ``trainer.*``; ``rollout.*`` is the engine
of the held-out generations). The run is :class:`~hybrid_rl.trainer.sft.trainer.SFTTrainer`: the
actor worker trains with the ``sft`` loss, one optimizer step per ``data.train_batch_size``
conversations; checkpoints, resume, trackers and the plot are the trainer core's. Without
``data.train_files`` it trains on the arithmetic task's SFT examples (``hybrid_rl.data.rlhf_data``,
the RL task's split), validating the held-out loss and the greedy accuracy on the 200 held-out problems.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hybrid_rl.trainer.modes import MODES, compose, run_config, run_mode

__all__ = ["SFT_MODE", "main", "run_sft", "sft_config"]

SFT_MODE = MODES["sft"]
"""This command's row of :data:`hybrid_rl.trainer.modes.MODES`."""


def sft_config(argv: Sequence[str] = ()):
    """The typed :class:`SFTConfig` of ``key=value`` arguments (unknown keys: one line naming the nearest)."""
    return compose(SFT_MODE, argv)


def run_sft(argv: Sequence[str] = ()) -> dict[str, float]:
    """Run an SFT job from ``key=value`` arguments (a notebook's entry); returns the last step's metrics."""
    return run_config("sft", sft_config(argv))


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m hybrid_rl.trainer.main_sft [key=value ...]``."""
    run_mode("sft", argv)


if __name__ == "__main__":
    main()
