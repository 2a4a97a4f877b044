"""The redaction helper: URLs' passwords, secret-named keys, whole configs."""

import io
import logging
import sys

import pytest
from omegaconf import OmegaConf

from hybrid_rl.utils.redact import (REDACTED, RedactingFilter, is_secret_key, redact_config, redact_text, redact_url,
                                    redacted_console)

PG = "postgresql+psycopg://alice:s3cr%40t@db.example:5432/rl"


@pytest.mark.parametrize("url, expected", [
    (PG, "postgresql+psycopg://alice:***@db.example:5432/rl"),
    ("postgres://bob:pw@h/db?sslmode=require", "postgres://bob:***@h/db?sslmode=require"),
    ("postgresql://:only@h/db", "postgresql://:***@h/db"),
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),  # an unescaped '@': hidden up to the last one
    ("postgresql://h/db?user=u&password=pw&sslmode=require", "postgresql://h/db?user=u&password=***&sslmode=require"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),  # no password: unchanged
    ("postgresql://u:@h/db", "postgresql://u:@h/db"),  # an empty password: nothing to hide
    ("sqlite:///run/experiences.db", "sqlite:///run/experiences.db"),
    ("/tmp/run/experiences.db", "/tmp/run/experiences.db"),
    ("http://localhost:8000/v1", "http://localhost:8000/v1"),
])
def test_redact_url(url, expected):
    assert redact_url(url) == expected


@pytest.mark.parametrize("password", ["Pw LEAK", "Pw'LEAK", 'Pw"LEAK', "Pw@LEAK", "Pw%40LEAK", "Pw:LEAK", "Pw/LEAK",
                                      "Pw@LE AK@", " LEAK"])
def test_every_password_sqlalchemy_accepts_is_hidden(password):
    """A whole URL hides what make_url takes for the password (spaces, quotes, ':' and '/' included)
    and, with an unescaped '@', everything up to the last one; so does a line of text holding it."""
    url = f"postgresql+psycopg://alice:{password}@127.0.0.1:1/db"
    shown = "postgresql+psycopg://alice:***@127.0.0.1:1/db"
    assert redact_url(url) == shown and redact_config({"path": url}) == {"path": shown}
    echo = f"Error executing job with overrides: [\"async_training.buffer.path='{url}'\", 'trainer.n=1']"
    assert redact_text(echo) == echo.replace(url, shown)
    assert redact_text(f"cannot open {url}: refused\nnext {url}") == f"cannot open {shown}: refused\nnext {shown}"


@pytest.mark.parametrize("url, expected", [
    ("postgresql+psycopg://alice:PwLEAK", "postgresql+psycopg://alice:***"),  # no '@': not a port, so hidden
    ("postgresql+psycopg://alice:PwLEAK/db", "postgresql+psycopg://alice:***/db"),
    ("postgresql://h:5432/db", "postgresql://h:5432/db"),  # a port stays
    ("postgresql://user@server:pw@host/db", "postgresql://user@server:***@host/db"),  # Azure's user@server
    ("postgresql://u:p@ss@h/db?x=a@b", "postgresql://u:***@b"),  # '@' in the host: hidden to the last '@'
])
def test_whole_urls_that_make_url_reads_oddly(url, expected):
    assert redact_url(url) == expected


def test_free_text_keeps_ports_and_paths_of_urls_without_a_password():
    for line in ("serving http://localhost:8000/v1 for bob@x.org", "at http://127.0.0.1:8000 ok, mail a@b",
                 "http://h:8000?a=b"):
        assert redact_text(line) == line


def test_free_text_hides_a_password_given_without_a_host():
    """``user:password`` with no ``@host`` (make_url reads the password as a port): a printed config
    line or an error quoting it hides the word after ':' unless it is a number."""
    assert redact_text("buffer:\n    path: postgresql+psycopg://alice:PwLEAK\n") == \
        "buffer:\n    path: postgresql+psycopg://alice:***\n"
    assert redact_text("'postgresql://alice:Pw/db' failed") == "'postgresql://alice:***/db' failed"


def test_redact_text_hides_every_url_and_secret_override():
    hydra_echo = ("Error executing job with overrides: ['async_training.buffer.path=" + PG + "', "
                  "'+reward.api_key=sk-123', 'data.train_batch_size=4']")
    assert redact_text(hydra_echo) == (
        "Error executing job with overrides: ['async_training.buffer.path=postgresql+psycopg://alice:***@"
        "db.example:5432/rl', '+reward.api_key=***', 'data.train_batch_size=4']")
    two = f"copy {PG} to mysql://root:toor@m/x now"
    assert redact_text(two) == "copy postgresql+psycopg://alice:***@db.example:5432/rl to mysql://root:***@m/x now"
    assert redact_text("max_tokens=512 token_ids=3") == "max_tokens=512 token_ids=3"


@pytest.mark.parametrize("name", ["password", "db_password", "api_key", "apiKey", "OPENAI_API_KEY", "hf_token",
                                  "token", "access_token", "client-secret", "a.b.secret", "private_key"])
def test_secret_key_names(name):
    assert is_secret_key(name)


@pytest.mark.parametrize("name", ["tokenizer", "max_tokens", "pad_token", "eos_token_ids", "pad_token_id",
                                  "prompt_key", "reward_fn_key", "max_num_batched_tokens", "path", "keys", 3])
def test_ordinary_key_names(name):
    assert not is_secret_key(name)


def test_redact_config_walks_every_container_and_leaves_the_input():
    config = {"async_training": {"buffer": {"storage_type": "sql", "path": PG, "name": None}},
              "trainer": {"logger": ["console", PG], "n": 3, "ok": True},
              "agents": [{"api_key": "sk-1", "token": None, "hf_token": ""}],
              "reward": {"secret": {"nested": 1}}}
    out = redact_config(config)
    assert out == {"async_training": {"buffer": {"storage_type": "sql", "name": None,
                                                 "path": "postgresql+psycopg://alice:***@db.example:5432/rl"}},
                   "trainer": {"logger": ["console", "postgresql+psycopg://alice:***@db.example:5432/rl"],
                               "n": 3, "ok": True},
                   "agents": [{"api_key": REDACTED, "token": None, "hf_token": ""}],
                   "reward": {"secret": REDACTED}}
    assert config["async_training"]["buffer"]["path"] == PG and config["agents"][0]["api_key"] == "sk-1"


def test_redact_config_of_an_omegaconf_container():
    cfg = OmegaConf.create({"buffer": {"path": PG}, "items": [PG], "password": "pw"})
    out = redact_config(cfg)
    assert out == {"buffer": {"path": "postgresql+psycopg://alice:***@db.example:5432/rl"},
                   "items": ["postgresql+psycopg://alice:***@db.example:5432/rl"], "password": REDACTED}
    assert "s3cr" not in repr(out)


def test_redact_text_hides_quoted_overrides_and_yaml_lines():
    assert redact_text("+reward.api_key='sk 1' x=2") == "+reward.api_key=*** x=2"
    printed = "reward:\n  api_key: sk-1\n  token: null\n  max_tokens: 8\n  - password: pw\n"
    assert redact_text(printed) == "reward:\n  api_key: ***\n  token: null\n  max_tokens: 8\n  - password: ***\n"


def _logged(*args, exc: BaseException | None = None) -> str:
    """What a handler with the filter writes for ``logger.error(*args)`` (with ``exc`` as exc_info)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger(f"test_redact.{len(args)}.{exc is not None}")
    log.propagate, log.handlers = False, [handler]
    try:
        if exc is None:
            log.error(*args)
        else:
            try:
                raise exc
            except type(exc):
                log.exception(*args)
    finally:
        log.handlers = []
    return stream.getvalue()


def test_the_logging_filter_hides_messages_arguments_and_tracebacks():
    assert _logged("buffer at %s (%d rows)", PG, 3) == "buffer at postgresql+psycopg://alice:***@db.example:5432/rl (3 rows)\n"
    text = _logged("failed", exc=RuntimeError(f"cannot open {PG}"))
    assert "s3cr" not in text and "RuntimeError: cannot open postgresql+psycopg://alice:***@db.example" in text
    assert "Traceback (most recent call last)" in text


def test_redacted_console_hides_writes_and_puts_the_streams_back(capsys):
    before = sys.stdout, sys.stderr
    with redacted_console():
        print(f"url={PG}")
        sys.stderr.write(f"Error executing job with overrides: ['a.b.path={PG}']\n")
        assert sys.stdout.isatty() == before[0].isatty()  # everything else is the wrapped stream's
    assert (sys.stdout, sys.stderr) == before
    out, err = capsys.readouterr()
    assert out == "url=postgresql+psycopg://alice:***@db.example:5432/rl\n"
    assert err == "Error executing job with overrides: ['a.b.path=postgresql+psycopg://alice:***@db.example:5432/rl']\n"
