"""The trainer's modes in one table, and the one code path behind every entry point.

    python -m hybrid_rl.trainer.main_ppo [key=value ...]            # each main_<mode> is run_mode("<mode>")
    python -m hybrid_rl.trainer.main_sft --help [key=value ...]     # every key, its value and documentation
    python -m hybrid_rl.trainer.main_rm --cfg job [key=value ...]   # the resolved config as YAML, once checked
    python -m hybrid_rl.trainer.main_sft --config-path DIR --config-name NAME [key=value ...]

:data:`MODES` maps a mode's name to its :class:`ModeSpec`: the config schema (the YAML and the
dataclass under it), the trainer class, the entry module, the default task and a description.
:func:`run_mode` is the command line of every mode: Hydra composition, ``--help``, ``--cfg job``,
user mistakes as ONE line ``hybrid_rl config error: ...`` with exit status 2 (:func:`fail`), secrets
redacted on the console, the quiet console and ``<run>/logs/driver.log``, and the single-process
choice of a command-line run. A new mode adds its row with :func:`register_mode` (its package holds
its config, trainer and checks) and a ``main_<mode>.py`` calling ``run_mode("<mode>")``.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from hybrid_rl.trainer.config.loader import PPO_SCHEMA, RM_SCHEMA, SFT_SCHEMA, ConfigSchema
from hybrid_rl.trainer.dpo.config import DPO_SCHEMA
from hybrid_rl.utils.registry import EntryInfo, Registry

__all__ = ["CONFIG_ERROR_EXIT_CODE", "FULL_ERROR_ENV", "MODES", "ModeSpec", "compose", "configure_driver_logging",
           "fail", "get_mode", "help_text", "is_reported_user_error", "parse_args", "register_mode", "run_config",
           "run_mode", "user_error_message"]

CONFIG_ERROR_EXIT_CODE = 2
FULL_ERROR_ENV = "HYBRID_RL_FULL_ERROR"
"""Set to 1 to see the traceback of a user error instead of its one-line message."""

_HELP_TAIL = ("the value shown is the one this command line gets. --cfg job prints the resolved config as YAML after "
              "the run's config checks (a bad value gets the run's one-line error; no model is loaded{ray}).")


@dataclass(frozen=True)
class ModeSpec:
    """One row of :data:`MODES`: what a mode's entry point composes, says, checks and runs. The
    ``module:attribute`` paths are imported only when used, so ``--help`` stays light."""

    name: str
    """The mode's name (``ppo``, ``sft``, ``rm``); ``run_mode(name)`` runs it."""
    schema: ConfigSchema
    """Its config: the YAML in ``hybrid_rl/trainer/config/`` and the dataclass holding every key."""
    trainer: str
    """``module:Class`` of the trainer a run builds from the typed config (a TrainerCore)."""
    entry_module: str
    """The command's module (``hybrid_rl.trainer.main_<name>``), named in ``--help``."""
    default_task: str
    """What a run trains on without ``data.train_files`` (documentation)."""
    description: str
    """One sentence on what the command trains (the head of ``--help``)."""
    key_names: str
    """Whose key names the command takes (said in ``--help``), e.g. veRL's."""
    validate: str
    """``module:function`` checking a typed config without loading a model (``--cfg job``)."""
    resume_problems: Optional[str] = None
    """``module:function(config, point) -> list[str]``: why the mode cannot load the checkpoint ``point``
    (``--cfg job``'s runtime checks; the trainer's ``_resume_problems``); None: the worker count only."""
    build: Optional[str] = None
    """``module:function(config)`` building the trainer with the mode's start-up checks; None: the trainer class."""
    notices: Optional[str] = None
    """``module:function(config, overrides) -> list[str]``: the mode's advice logged when a run starts."""
    help_notes: Optional[str] = None
    """``module:function() -> {key: lines}``: lines under keys in ``--help`` (a registry's entries)."""
    help_block: Optional[str] = None
    """``module:function() -> str``: a block at the end of ``--help`` (every registry's listing)."""
    hydra_app: bool = False
    """The run goes through Hydra's app runner (its flags, ``--cfg`` print, run folder); False: this
    module's parser (``--help``, ``--cfg job``, ``--config-path DIR --config-name NAME`` only)."""
    starts_ray: bool = True
    """``--help`` says Ray is not started by ``--cfg job`` (the modes whose runs need Ray for more than one worker)."""

    def resolve(self, field: str) -> Optional[Callable[..., Any]]:
        """The object a ``module:attribute`` field names (looked up at each call: a test may patch it)."""
        path = getattr(self, field)
        if path is None:
            return None
        module, _, attribute = path.partition(":")
        return getattr(importlib.import_module(module), attribute)


_MODES: Registry[EntryInfo] = Registry(
    "mode", "the main_* command", listed=False,  # picked by the command, not by a config key: not in --help
    duplicate_error=lambda name, old, new: (f"mode {name!r} is registered already ({old.entry_module}); "
                                            "give the new mode another name."),
    unknown_error=lambda name, names: f"unknown mode {name!r}; the modes are {names}.")
MODES = _MODES.entry_view()
"""Every mode by name, read-only (its row is added by :func:`register_mode`)."""


def register_mode(spec: ModeSpec) -> ModeSpec:
    """Add ``spec``'s row to :data:`MODES` (a name is registered once)."""
    return _MODES.add(spec.name, spec, EntryInfo(description=spec.description))


def get_mode(name: str) -> ModeSpec:
    """The row of mode ``name``."""
    return _MODES.get(name)


register_mode(ModeSpec(
    "ppo", PPO_SCHEMA, "hybrid_rl.trainer.ppo.trainer:RayPPOTrainer", "hybrid_rl.trainer.main_ppo",
    "the arithmetic task's prompts (hybrid_rl.trainer.core.default_task), generated on first use",
    "RL training of the PPO family (PPO, GRPO, RLOO, REINFORCE++, ReMax and any registered estimator), "
    "colocated or decoupled.", "on the command line (veRL's names)", "hybrid_rl.trainer.config.checks:validate_config",
    resume_problems="hybrid_rl.trainer.config.checks:resume_point_problems",
    build="hybrid_rl.trainer.main_ppo:build_trainer", notices="hybrid_rl.trainer.main_ppo:config_notices",
    help_notes="hybrid_rl.trainer.registry_help:registry_notes",
    help_block="hybrid_rl.trainer.registry_help:registry_help", hydra_app=True))
register_mode(ModeSpec(
    "sft", SFT_SCHEMA, "hybrid_rl.trainer.sft.trainer:SFTTrainer", "hybrid_rl.trainer.main_sft",
    "the arithmetic task's SFT examples (hybrid_rl.data.rlhf_data), generated on first use",
    "Supervised fine-tuning with the masked negative log-likelihood of the assistant turns.",
    "(veRL's SFT trainer names)", "hybrid_rl.trainer.config.supervised_checks:validate_supervised_config",
    starts_ray=False))
register_mode(ModeSpec(
    "rm", RM_SCHEMA, "hybrid_rl.trainer.rm.trainer:RMTrainer", "hybrid_rl.trainer.main_rm",
    "the arithmetic task's preference pairs (hybrid_rl.data.rlhf_data), generated on first use",
    "Reward-model training on preference pairs (Bradley-Terry).", "(veRL's SFT trainer names)",
    "hybrid_rl.trainer.config.supervised_checks:validate_supervised_config", starts_ray=False))
register_mode(ModeSpec(
    "dpo", DPO_SCHEMA,
    "hybrid_rl.trainer.dpo.trainer:DPOTrainer", "hybrid_rl.trainer.main_dpo",
    "the arithmetic task's preference pairs (hybrid_rl.data.rlhf_data), generated on first use",
    "Offline DPO on preference pairs (TRL's loss types: sigmoid, robust, hinge, ipo, simpo).",
    "(veRL's SFT trainer names; dpo.* are TRL's)", "hybrid_rl.trainer.dpo.checks:validate_dpo_config",
    starts_ray=False))


# ----------------------------------------------------------------------------- user mistakes: one line
def user_error_message(error: BaseException) -> Optional[str]:
    """The message of a user mistake (a ``ValueError``), also when Ray wrapped it; None otherwise.

    A ValueError raised in a worker method arrives as ``RayTaskError`` (its ``cause`` is the
    original); one raised in a worker constructor kills the actor and only its text survives in
    the ``ActorDiedError`` (possibly itself the cause of a ``WorkerGroupError``).
    """
    from ray.exceptions import RayActorError, RayTaskError

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RayTaskError):
            error = error.cause
            continue
        if isinstance(error, ValueError):
            return str(error)
        if isinstance(error, RayActorError) and error.actor_init_failed:
            return _value_error_in_text(str(error))
        error = error.__cause__
    return None


def _value_error_in_text(text: str) -> Optional[str]:
    """The message of the last ``ValueError: ...`` of a remote traceback text (None if there is none)."""
    matches = re.findall(r"^ValueError: (.*?)(?=\n\S+Error: |\Z)", text, flags=re.M | re.S)
    return matches[-1].strip() if matches else None


def fail(error: BaseException) -> None:
    """End the command with one line on stderr and exit status 2: a user mistake is not a crash."""
    sys.stderr.flush()
    from hybrid_rl.utils.redact import redact_text

    sys.stderr.write(f"hybrid_rl config error: {redact_text(str(user_error_message(error) or error))}\n")
    sys.stderr.flush()
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def is_reported_user_error(error: BaseException) -> bool:
    """True if ``error`` is a user mistake to report in one line (not with HYBRID_RL_FULL_ERROR=1)."""
    return os.environ.get(FULL_ERROR_ENV) != "1" and user_error_message(error) is not None


# ----------------------------------------------------------------------------- composing and --help
def compose(spec: ModeSpec, overrides: Sequence[str], config_dir: Optional[str] = None,
            config_name: Optional[str] = None) -> Any:
    """The mode's typed config of ``overrides`` (over a user's YAML when ``config_dir`` is given);
    unknown keys are one line naming the nearest."""
    from hybrid_rl.trainer.config.loader import get_config, to_typed_config

    return to_typed_config(get_config(list(overrides), spec.schema, config_dir, config_name), spec.schema.node)


def help_text(spec: ModeSpec, overrides: Sequence[str], config_dir: Optional[str] = None,
              config_name: Optional[str] = None) -> str:
    """``--help``: every key with its value under ``overrides`` and its documentation."""
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.docs import config_help
    from hybrid_rl.trainer.config.loader import get_config

    composed = OmegaConf.to_container(get_config(list(overrides), spec.schema, config_dir, config_name), resolve=False)
    composed.pop("hydra", None)
    usage = (f"usage: python -m {spec.entry_module} [key=value ...] [--cfg job] "
             "[--config-path DIR --config-name NAME]")
    intro = (f"{spec.description} Every key below is set as key=value {spec.key_names}; "
             + _HELP_TAIL.format(ray=", Ray is not started" if spec.starts_ray else ""))
    notes, block = spec.resolve("help_notes"), spec.resolve("help_block")
    text = config_help(spec.schema.node, composed, usage, intro, notes() if notes else None)
    return text + ("\n" + block() if block else "")


# ----------------------------------------------------------------------------- the command line
def parse_args(argv: Sequence[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """``(key=value overrides, {--config-path, --config-name, --cfg: value}, other flags)``."""
    overrides, options, flags = [], {}, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("--config-path", "--config-name", "--cfg", "-cp", "-cn", "-c"):
            long = {"-cp": "--config-path", "-cn": "--config-name", "-c": "--cfg"}.get(name, name)
            options[long] = value if eq else (args.pop(0) if args else "")
        elif arg.startswith("-"):
            flags.append(arg)
        elif not eq:
            raise ValueError(f"cannot parse {arg!r}: write key=value (e.g. optim.lr=1e-5).")
        else:
            overrides.append(arg)
    return overrides, options, flags


@dataclass(frozen=True)
class _Request:
    """What a command line asks for."""

    overrides: list[str]
    """The key=value settings (Hydra's own ``hydra.*`` ones excluded)."""
    config_dir: Optional[str]
    """``--config-path`` (None: the package's YAML)."""
    config_name: Optional[str]
    """``--config-name``."""
    help: bool
    """``--help``: print every key and stop."""
    print_config: bool
    """``--cfg job``: print the checked config and run nothing."""


def _override_args(argv: Sequence[str]) -> list[str]:
    """The key=value overrides among Hydra's command-line arguments (flags like --cfg excluded)."""
    return [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def _own(overrides: Sequence[str]) -> list[str]:
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]


def _read_request(spec: ModeSpec, args: Sequence[str]) -> _Request:
    """The request of ``args``: Hydra's own flags pass for a ``hydra_app`` mode (its runner reads
    them); the other modes take only ``--help``, ``--cfg job`` and ``--config-path/--config-name``."""
    if spec.hydra_app:
        asked = set(args)
        return _Request(_own(_override_args(args)), None, None, bool({"--help", "-h"} & asked),
                        bool({"--cfg", "-c"} & asked))
    overrides, options, flags = parse_args(args)
    config_dir, config_name = options.get("--config-path"), options.get("--config-name")
    if bool(config_dir) != bool(config_name):
        raise ValueError("--config-path DIR and --config-name NAME go together (the YAML is DIR/NAME.yaml).")
    if {"--help", "-h"} & set(flags):
        return _Request(_own(overrides), config_dir, config_name, True, False)
    if flags or options.get("--cfg", "job") != "job":
        raise ValueError(f"unknown flag(s) {flags or ['--cfg ' + options['--cfg']]}: this command takes key=value "
                         "settings, --help, --cfg job and --config-path DIR --config-name NAME.")
    return _Request(_own(overrides), config_dir, config_name, False, "--cfg" in options)


def run_mode(name: str, argv: Optional[Sequence[str]] = None) -> None:
    """The command line of mode ``name`` (``python -m hybrid_rl.trainer.main_<name> [key=value ...]``):
    ``argv`` None reads ``sys.argv`` (a real command line: ``trainer.single_process`` may be chosen
    and the command restarted for it); a list is a call from Python (a test, a script)."""
    spec = get_mode(name)
    command_line = argv is None
    if not command_line and spec.hydra_app:
        sys.argv = [sys.argv[0], *argv]  # Hydra's runner reads the command line from sys.argv
    args = sys.argv[1:] if command_line else list(argv)
    try:
        request = _read_request(spec, args)
        if request.help:
            sys.stdout.write(help_text(spec, request.overrides, request.config_dir, request.config_name))
            return
        # Composed once here, outside Hydra's app runner, which would print a multi-line report and a
        # HYDRA_FULL_ERROR hint for a wrong type instead of one line.
        from hybrid_rl.utils.log_setup import recorded_config_notices

        with recorded_config_notices() as deprecated:  # a run logs them when its logging is set up
            cfg = compose(spec, request.overrides, request.config_dir, request.config_name)
        if request.print_config and _print_config(spec, cfg, deprecated, command_line):
            return
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        if is_reported_user_error(error):
            fail(error)
        raise
    if spec.hydra_app:
        _run_hydra_app(spec, cfg, command_line)
    else:
        _run_command(spec, cfg, deprecated, command_line)


def _print_config(spec: ModeSpec, cfg: Any, deprecated: list[str], command_line: bool) -> bool:
    """``--cfg job``: the deprecation notices on stderr, the run's own checks (none that loads a model
    or starts Ray), then the config as YAML without passwords; True when printed here (False: Hydra's
    runner prints it, under the redacted console)."""
    from hybrid_rl.trainer.config.run_checks import world_size_problems
    from hybrid_rl.trainer.core.runtime_checks import check_run_state
    from hybrid_rl.trainer.core.single_process import resolve_single_process

    sys.stderr.write("".join(notice + "\n" for notice in deprecated))
    checked = resolve_single_process(cfg) if command_line else cfg
    spec.resolve("validate")(checked)
    check_run_state(checked, spec.resolve("resume_problems") or world_size_problems)  # as the trainer does
    if spec.hydra_app:
        return False
    from omegaconf import OmegaConf

    from hybrid_rl.trainer.config.loader import to_container
    from hybrid_rl.utils.redact import redact_config

    sys.stdout.write(OmegaConf.to_yaml(redact_config(to_container(cfg))))  # a console: no passwords
    return True


def _reexec_if_single_process(cfg: Any, command_line: bool) -> Any:
    """A command-line run of one worker that needs nothing only Ray gives hosts it in this process
    (``trainer.single_process`` null = auto): the command restarts once with the worker's allocator
    and logging set. Returns ``cfg`` with the choice made."""
    if not command_line:
        return cfg
    from hybrid_rl.trainer.core.single_process import reexec_for_single_process, resolve_single_process

    cfg = resolve_single_process(cfg)
    if cfg.trainer.single_process:
        reexec_for_single_process(cfg)
    return cfg


def _run_hydra_app(spec: ModeSpec, cfg: Any, command_line: bool) -> None:
    """Run under Hydra's app runner, which composes the run's config again (its flags and
    ``--config-path`` included) and prints ``--cfg job`` itself; the console hides passwords."""
    import hydra

    from hybrid_rl.trainer.config.loader import CONFIG_DIR
    from hybrid_rl.utils.redact import redacted_console

    _reexec_if_single_process(cfg, command_line)

    def hydra_task(config: Any) -> None:
        _run_task(spec, config, None, command_line)

    task = hydra.main(config_path=CONFIG_DIR, config_name=spec.schema.config_name, version_base="1.3")(hydra_task)
    if not any(a.lstrip("+~").startswith("hydra.output_subdir=") for a in sys.argv[1:]):
        # No .hydra/{config,overrides}.yaml copy of the overrides (a database password) for a user's YAML
        # that lacks the package's hydra section.
        # Beside the other overrides: argparse takes them as one run (``k=v --cfg job`` + k2=v2 fails).
        first = next((i for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("-") and "=" in a), None)
        sys.argv.insert(len(sys.argv) if first is None else first + 1, "hydra.output_subdir=null")
    with redacted_console():  # Hydra's "Error executing job with overrides: [...]" and --cfg print
        task()


def _run_command(spec: ModeSpec, cfg: Any, deprecated: list[str], command_line: bool) -> None:
    """Run the composed ``cfg`` with this module's console (messages only, as Hydra's runner gives)."""
    try:
        cfg = _reexec_if_single_process(cfg, command_line)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        if is_reported_user_error(error):
            fail(error)
        raise
    if not logging.getLogger().handlers:  # the console Hydra's runner gives: messages only
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger().addHandler(console)
    _run_task(spec, cfg, deprecated, command_line=False)


def _run_task(spec: ModeSpec, cfg: Any, deprecated: Optional[list[str]], command_line: bool) -> None:
    """Type ``cfg``, set up the driver's logging, log the notices, build and run the trainer; a user
    mistake stops the workers and ends in one line. ``deprecated`` None: ``cfg`` is Hydra's
    composition, typed here (its notices recorded); ``command_line``: choose ``trainer.single_process``."""
    from hybrid_rl.trainer.config.loader import to_typed_config
    from hybrid_rl.trainer.core.supervisor import run_supervised
    from hybrid_rl.utils.log_setup import recorded_config_notices

    trainer = None
    try:
        if deprecated is None:
            with recorded_config_notices() as deprecated:  # plain lines, as the mode's notices below
                cfg = to_typed_config(cfg, spec.schema.node)
        configure_driver_logging(cfg, always=True)
        notices = spec.resolve("notices")
        overrides = _override_args(sys.argv[1:])
        for notice in deprecated + (notices(cfg, overrides) if notices else []):
            logging.getLogger(spec.entry_module).warning(notice)
        if command_line:
            from hybrid_rl.trainer.core.single_process import resolve_single_process

            cfg = resolve_single_process(cfg)
        build = _builder(spec)
        trainer = build(cfg)
        run_supervised(trainer, build)  # trainer.max_restarts: restart after a worker failure
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a user mistake
        user_error = is_reported_user_error(error)
        if user_error:
            # The other workers failed the same way; Ray would print their tracebacks at exit
            # ("Unhandled error") after our one line. Ray reads this variable when it prints.
            os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        if trainer is not None:
            trainer.shutdown()
            trainer = None
        if user_error:
            fail(error)
        raise
    finally:
        if trainer is not None:
            trainer.shutdown()


def _builder(spec: ModeSpec, trainer_cls: Optional[type] = None) -> Callable[[Any], Any]:
    """``config -> trainer``: the mode's builder (its start-up checks), else its trainer class."""
    build = spec.resolve("build")
    if build is not None:
        return build if trainer_cls is None else (lambda config: build(config, trainer_cls))
    return trainer_cls or spec.resolve("trainer")


# ----------------------------------------------------------------------------- logging and notebooks
def configure_driver_logging(cfg: Any, always: bool) -> None:
    """The quiet console of ``trainer.log_level`` and ``<run>/logs/driver.log``
    (hybrid_rl/utils/log_setup.py). From a notebook (``always=False``) only when the caller
    configured no logging at all: a user's own logging set-up is left as it is."""
    from hybrid_rl.trainer.config.run_checks import raise_problems, run_dir
    from hybrid_rl.trainer.core.runtime_checks import run_dir_problems
    from hybrid_rl.utils.log_setup import configure_logging, only_own_handlers

    if always or (only_own_handlers() and not logging.getLogger("hybrid_rl").handlers):
        raise_problems(run_dir_problems(cfg))  # one line, not the log file's FileNotFoundError
        configure_logging(cfg.trainer.log_level, os.path.join(run_dir(cfg), "logs", "driver.log"))


def run_config(name: str, cfg: Any, trainer_cls: Optional[type] = None) -> dict[str, float]:
    """Run a whole training job of mode ``name`` from ``cfg`` (typed or composed; a notebook's
    entry); returns the last step's metrics. The workers are stopped at the end."""
    from hybrid_rl.trainer.config.loader import to_typed_config
    from hybrid_rl.trainer.core.supervisor import run_supervised

    spec = get_mode(name)
    cfg = to_typed_config(cfg, spec.schema.node)  # once: its deprecation notices are given once
    configure_driver_logging(cfg, always=False)
    build = _builder(spec, trainer_cls)
    # Stops the workers at the end; restarts them after a worker failure per trainer.max_restarts.
    return run_supervised(build(cfg), build)
