"""The quiet console: hybrid_rl's lines and real warnings pass, library INFO and known-harmless
warnings go only to the log file; debug brings everything back."""

import io
import logging

import pytest

from hybrid_rl.utils import log_setup as L


def _record(name: str, level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_filter_rules():
    f = L.QuietConsoleFilter()
    assert f.filter(_record("hybrid_rl.trainer", logging.INFO, "started a local Ray instance"))
    worker = L.QuietConsoleFilter(own_level=logging.WARNING)  # a worker's own INFO goes to its file only
    assert not worker.filter(_record("hybrid_rl.worker", logging.INFO, "joined the gloo group"))
    assert worker.filter(_record("hybrid_rl.rollout", logging.WARNING, "falling back to the hf rollout"))
    assert f.filter(_record("hybrid_rl", logging.INFO, "precision on cpu"))
    assert not f.filter(_record("vllm.config", logging.INFO, "Using max model len 640"))
    assert f.filter(_record("vllm.engine", logging.WARNING, "KV cache is too small"))
    assert f.filter(_record("transformers.modeling", logging.ERROR, "boom"))
    for harmless in ("Chat template warmup failed", "Failed to create oneDNN linear, fallback to torch linear. x",
                     "RotaryEmbedding: Failed to load weights",
                     "Attempted to load weight norm.weight with dtype torch.float32 into parameter with dtype "
                     "torch.bfloat16"):
        assert not f.filter(_record("vllm.x", logging.WARNING, harmless)), harmless
    fsdp_view = ("/x/_fsdp_state.py:331: UserWarning: FSDP2-wrapped module (FSDPLlamaForCausalLM) returned a view "
                 "tensor. An in-place op on this view (e.g., `x += y`) will silently drop the pre-backward hook")
    assert not f.filter(_record("py.warnings", logging.WARNING, fsdp_view))
    assert f.filter(_record("py.warnings", logging.WARNING, "UserWarning: something else"))


@pytest.fixture
def clean_root(monkeypatch):
    """A root logger with only a test stream handler; restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("hybrid_rl").level)
    stream = io.StringIO()
    root.handlers = [logging.StreamHandler(stream)]
    monkeypatch.delenv(L.LOG_LEVEL_ENV, raising=False)
    # Ray's handlers and transformers' progress bars are process-wide: leave them to the real runs.
    monkeypatch.setattr(L, "_library_handlers", lambda: [])
    monkeypatch.setattr(L, "_quiet_progress_bars", lambda: None)
    yield stream
    for handler in root.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.close()
    root.handlers, root.level = saved[0], saved[1]
    logging.getLogger("hybrid_rl").setLevel(saved[2])
    logging.captureWarnings(False)


def test_console_is_quiet_and_the_file_keeps_everything(clean_root, tmp_path):
    log_file = tmp_path / "logs" / "worker_0.log"
    assert L.configure_logging("info", str(log_file)) == "info"
    L.configure_logging("info", str(log_file))  # idempotent: one filter, one file handler
    root = logging.getLogger()
    assert sum(isinstance(h, logging.FileHandler) for h in root.handlers) == 1
    logging.getLogger("hybrid_rl.test").info("own line")
    logging.getLogger("enginelib.test").info("engine chatter")
    logging.getLogger("enginelib.test").warning("Chat template warmup failed")
    logging.getLogger("somelib.test").warning("a real warning")
    console = clean_root.getvalue()
    assert "own line" in console and "a real warning" in console
    assert "engine chatter" not in console and "Chat template" not in console
    text = log_file.read_text()
    for line in ("own line", "engine chatter", "Chat template warmup failed", "a real warning"):
        assert line in text


def test_debug_shows_everything_and_env_wins(clean_root, monkeypatch):
    L.configure_logging("info")
    monkeypatch.setenv(L.LOG_LEVEL_ENV, "debug")
    assert L.configure_logging("info") == "debug"
    logging.getLogger("enginelib.test").info("engine chatter")
    logging.getLogger("enginelib.test").debug("engine detail")
    assert "engine chatter" in clean_root.getvalue() and "engine detail" in clean_root.getvalue()


def test_bad_level_is_one_line_error(monkeypatch):
    monkeypatch.delenv(L.LOG_LEVEL_ENV, raising=False)
    with pytest.raises(ValueError, match=r"trainer.log_level='loud'.*Fix: use info"):
        L.effective_level("loud")
    monkeypatch.setenv(L.LOG_LEVEL_ENV, "LOUDER")
    with pytest.raises(ValueError, match=r"HYBRID_RL_LOG_LEVEL='louder'"):
        L.effective_level("info")


def test_a_later_run_replaces_the_earlier_runs_log_file(clean_root, tmp_path):
    """A notebook's second run_ppo writes to its own run folder, not to the first run's file."""
    first, second = tmp_path / "a" / "driver.log", tmp_path / "b" / "driver.log"
    L.configure_logging("info", str(first))
    assert L.only_own_handlers()
    L.configure_logging("info", str(second))
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    assert [h.baseFilename for h in files] == [str(second)]
    logging.getLogger("hybrid_rl.x").info("second run")
    assert "second run" in second.read_text() and "second run" not in first.read_text()


def test_library_env_routes_vllm_and_quiets_torch_cpp(monkeypatch):
    monkeypatch.delenv(L.LOG_LEVEL_ENV, raising=False)
    assert L.library_env("info") == {"VLLM_CONFIGURE_LOGGING": "0", L.LOG_LEVEL_ENV: "info",
                                     "TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert "TORCH_CPP_LOG_LEVEL" not in L.library_env("debug")


def test_config_notices_are_recorded_once_and_other_warnings_still_shown():
    import warnings

    from hybrid_rl.utils.log_setup import ConfigDeprecationWarning, recorded_config_notices

    with pytest.warns(UserWarning, match="another library's"):
        with recorded_config_notices() as texts:
            for _ in range(2):
                warnings.warn("a.b is deprecated; use a.c.", ConfigDeprecationWarning)
            warnings.warn("another library's warning", UserWarning)
            assert texts == []  # filled on leaving
    assert texts == ["a.b is deprecated; use a.c."]
    assert issubclass(ConfigDeprecationWarning, FutureWarning)  # Python callers see a FutureWarning


def test_config_notices_are_kept_when_the_block_raises():
    import warnings

    from hybrid_rl.utils.log_setup import ConfigDeprecationWarning, recorded_config_notices

    with pytest.warns(UserWarning, match="before the error"), pytest.raises(ValueError, match="bad"):
        with recorded_config_notices() as texts:
            warnings.warn("a.b is deprecated", ConfigDeprecationWarning)
            warnings.warn("before the error", UserWarning)
            raise ValueError("bad")
    assert texts == ["a.b is deprecated"]
