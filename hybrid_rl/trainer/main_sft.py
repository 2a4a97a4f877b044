"""Supervised fine-tuning: ``python -m hybrid_rl.trainer.main_sft [key=value ...]`` (veRL's SFT keys).

    python -m hybrid_rl.trainer.main_sft                                  # arithmetic SFT data, generated
    python -m hybrid_rl.trainer.main_sft data.train_files=sft_train.parquet data.val_files=sft_test.parquet \\
        data.prompt_key=prompt data.response_key=response model.partial_pretrain=HuggingFaceTB/SmolLM2-135M-Instruct \\
        optim.lr=1e-5 trainer.total_epochs=2

veRL's ``fsdp_sft_trainer`` names are translated onto the RL trainer's config (``SFT_KEY_MAP``):
``model.partial_pretrain`` is the actor's ``model.path``, ``optim.*`` its optimizer,
``data.micro_batch_size_per_gpu`` its micro-batch; every other key is the RL trainer's own
(``data.*``, ``trainer.*``, ``actor_rollout_ref.*``). The run is :class:`SFTTrainer`: the actor
worker trains with the ``sft`` loss, one optimizer step per ``data.train_batch_size`` conversations;
checkpoints, resume, trackers and the plot are the RL trainer's. Without ``data.train_files`` it
trains on the arithmetic task's SFT examples (``hybrid_rl.data.rlhf_data``, the RL task's split),
validating the held-out loss and the greedy accuracy on the 200 held-out problems.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["ModeHelp", "SFT_KEY_MAP", "default_data_files", "main", "mode_help", "run_cli", "run_sft", "sft_config",
           "sft_overrides", "translate_overrides", "typed_config"]

SFT_KEY_MAP = {
    "model.partial_pretrain": "actor_rollout_ref.model.path",
    "model.enable_gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "model.trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    "model.lora_rank": "actor_rollout_ref.model.lora_rank",
    "model.lora_alpha": "actor_rollout_ref.model.lora_alpha",
    "model.target_modules": "actor_rollout_ref.model.target_modules",
    "optim.lr": "actor_rollout_ref.actor.optim.lr",
    "optim.weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "optim.betas": "actor_rollout_ref.actor.optim.betas",
    "optim.warmup_steps_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "optim.lr_scheduler": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "data.micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
}
"""veRL SFT key -> the RL trainer's key."""

SFT_FIXED = ["actor_rollout_ref.actor.policy_loss.loss_mode=sft", "actor_rollout_ref.rollout.n=1",
             "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.entropy_coeff=0",
             "actor_rollout_ref.actor.ppo_epochs=1", "algorithm.use_kl_in_reward=false",
             # no advantage is used; a non-group estimator keeps the RL checks quiet about rollout.n=1
             "algorithm.adv_estimator=reinforce_plus_plus"]
SFT_DEFAULTS = {"trainer.experiment_name": "sft", "actor_rollout_ref.actor.optim.lr": "1e-5",
                "trainer.total_training_steps": "null", "trainer.total_epochs": "1"}


def default_data_files(overrides: list[str], names: tuple[str, str] = ("sft_train", "sft_test")) -> list[str]:
    """Without train files: the arithmetic task's SFT examples or preference pairs (``names``),
    generated once into its cache dir (the RL task's split)."""
    from hybrid_rl.data.rlhf_data import REJECTED_KINDS, arithmetic_examples, write_rlhf_data
    from hybrid_rl.trainer.config.loader import get_config

    arith = get_config(overrides).data.arithmetic
    version = f"{arith.num_train}-{arith.num_test}-{arith.seed}-{arith.max_digits}-k{len(REJECTED_KINDS)}-v3"  # v3: every kind per training problem, distractors, unscored forms
    folder = os.path.join(os.path.expanduser(arith.cache_dir), f"rlhf-{version}")
    paths = [os.path.join(folder, f"{name}.parquet") for name in names]
    if not all(os.path.isfile(p) for p in paths):
        write_rlhf_data(arithmetic_examples(arith.num_train, arith.num_test, arith.seed, arith.max_digits), folder)
    return [f"data.train_files={paths[0]}", f"data.val_files={paths[1]}"]


def translate_overrides(argv: Sequence[str], key_map: dict[str, str], defaults: dict[str, str],
                        fixed: list[str], batch_keys: Sequence[str]) -> tuple[list[str], set[str]]:
    """``(overrides, keys given)``: ``argv``'s keys renamed by ``key_map`` after ``defaults`` (those
    not given), then ``fixed``; ``data.train_batch_size`` is copied to each of ``batch_keys`` (one
    optimizer step per batch)."""
    out, given = [], set()
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ValueError(f"cannot parse {arg!r}: write key=value (e.g. optim.lr=1e-5).")
        key = key_map.get(key.lstrip("+"), key)
        given.add(key)
        out.append(f"{key}={value}")
        if key == "data.train_batch_size":
            out += [f"{k}={value}" for k in batch_keys]
    return [f"{k}={v}" for k, v in defaults.items() if k not in given] + out + fixed, given


def sft_overrides(argv: Sequence[str]) -> list[str]:
    """The RL trainer's overrides for an SFT command line (see the module docstring)."""
    out, given = translate_overrides(argv, SFT_KEY_MAP, SFT_DEFAULTS, SFT_FIXED,
                                     ["actor_rollout_ref.actor.ppo_mini_batch_size"])
    if "data.train_files" not in given:
        out += default_data_files(out)
    return out


def run_sft(argv: Sequence[str] = ()) -> dict[str, float]:
    """Run an SFT job from veRL-style ``key=value`` arguments; returns the last step's metrics."""
    return _run(sft_config(argv))


def sft_config(argv: Sequence[str]):
    """The typed config of an SFT command line (unknown keys: one line naming the nearest)."""
    return typed_config(sft_overrides(argv))


def typed_config(overrides: list[str]):
    """:class:`PPOConfig` of translated overrides (unknown keys: one line naming the nearest)."""
    from hybrid_rl.trainer.config.loader import check_override_keys, get_config, to_ppo_config

    check_override_keys(overrides)
    return to_ppo_config(get_config(overrides))


def _run(config) -> dict[str, float]:
    from hybrid_rl.trainer.sft_trainer import SFTTrainer
    from hybrid_rl.trainer.core.supervisor import run_supervised

    return run_supervised(SFTTrainer(config), SFTTrainer)


def main(argv: Optional[list[str]] = None) -> None:
    run_cli(sys.argv[1:] if argv is None else argv, sft_config, _run,
            ModeHelp("main_sft", "Supervised fine-tuning of the actor with the sft loss, veRL's SFT keys.", SFT_KEY_MAP))


@dataclass(frozen=True)
class ModeHelp:
    """What ``--help`` says of a mode's command line."""

    module: str
    """The entry point's module under ``hybrid_rl.trainer`` (``main_sft``)."""
    summary: str
    """One sentence on what the command trains."""
    key_map: dict[str, str]
    """The mode's own keys (veRL's names) -> the trainer keys they set."""


def mode_help(mode: ModeHelp, cfg: Any) -> str:
    """The mode's own keys with this command line's values and their documentation."""
    from hybrid_rl.trainer.config.docs import field_docs, indented, show_value
    from hybrid_rl.trainer.config.schema import key_owner

    out = [f"usage: python -m hybrid_rl.trainer.{mode.module} [key=value ...] [--cfg job]", "",
           *indented(mode.summary + " The keys it adds (value: this command line's):", ""), ""]
    for key, target in mode.key_map.items():
        owner, leaf = key_owner(cfg, target)
        out.append(f"  {key}={show_value(getattr(owner, leaf))}    (sets {target})")
        out += indented(field_docs(type(owner)).get(leaf, ""), "      ")
    out += ["", *indented("Every key of the RL trainer is accepted as well (python -m hybrid_rl.trainer.main_ppo "
                           "--help lists them with their documentation); --cfg job prints the resolved config.", "")]
    return "\n".join(out) + "\n"


def run_cli(argv: Sequence[str], make_config, run, mode: Optional[ModeHelp] = None) -> None:
    """Build the config from ``argv``, log to the console and ``logs/driver.log``, run; a user
    mistake ends in one line (as ``main_ppo``). ``--help`` prints the mode's keys, ``--cfg job`` the
    resolved config (Hydra's flag), and neither runs anything."""
    from hybrid_rl.trainer.main_ppo import _fail, _is_reported_user_error
    from hybrid_rl.trainer.config.checks import run_dir
    from hybrid_rl.utils.log_setup import configure_logging

    argv = list(argv)
    flags = [a for a in argv if a.startswith("-")]
    args = [a for a in argv if not a.startswith("-") and a != "job"]
    try:
        if flags:
            _answer_flags(flags, argv, make_config(args), mode)
            return
        cfg = make_config(argv)
        if not logging.getLogger().handlers:  # the console main_ppo gets from Hydra: messages only
            console = logging.StreamHandler(sys.stdout)
            console.setFormatter(logging.Formatter("%(message)s"))
            logging.getLogger().addHandler(console)
        configure_logging(cfg.trainer.log_level, os.path.join(run_dir(cfg), "logs", "driver.log"))
        run(cfg)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        if _is_reported_user_error(error):
            _fail(error)
        raise


def _answer_flags(flags: list[str], argv: list[str], cfg: Any, mode: Optional[ModeHelp]) -> None:
    """``--help`` / ``-h`` and ``--cfg job``; any other flag is a one-line error."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.loader import to_container

    if {"--help", "-h"} & set(flags) and mode is not None:
        sys.stdout.write(mode_help(mode, cfg))
    elif flags == ["--cfg"] and "job" in argv[argv.index("--cfg") + 1:argv.index("--cfg") + 2]:
        sys.stdout.write(OmegaConf.to_yaml(to_container(cfg)))
    else:
        raise ValueError(f"unknown flag(s) {flags}: this command takes key=value settings, --help and --cfg job.")


if __name__ == "__main__":
    main()
