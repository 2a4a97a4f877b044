"""Driver-side checks that need the built components (datasets, reward registry), run before Ray starts.

:func:`hybrid_rl.trainer.validate.validate_config` checks the config alone; the checks here look at
what the config produced, so a mistake that would otherwise surface only at the first reward
computation (after the workers loaded their models) fails in a second, with one line naming the
file and the fix.
"""

from __future__ import annotations

from typing import Any, Iterable

from hybrid_rl.trainer.config import PPOConfig

__all__ = ["check_reward_coverage"]


def check_reward_coverage(cfg: PPOConfig, *datasets: Any) -> None:
    """Raise ValueError if a dataset holds a ``data_source`` that no scorer handles.

    A custom reward function (``custom_reward_function.path``) scores every source, so nothing is
    checked then; nor for datasets that cannot list their sources (not an ``RLHFDataset``).
    """
    from hybrid_rl.reward import check_data_sources

    if cfg.custom_reward_function.path or cfg.data.reward_fn_key != "data_source":
        return
    for dataset, where in zip(datasets, _describe_files(cfg)):
        if not hasattr(dataset, "data_sources"):
            continue
        sources = dataset.data_sources()
        try:
            check_data_sources(sources)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def _describe_files(cfg: PPOConfig) -> Iterable[str]:
    if cfg.data.train_files is None:
        return ("the built-in arithmetic training set", "the built-in arithmetic test set")
    return (f"data.train_files={cfg.data.train_files!r}", f"data.val_files={cfg.data.val_files!r}")
