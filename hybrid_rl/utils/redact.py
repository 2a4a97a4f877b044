"""Secrets out of everything printed or logged: one helper for every printer of a URL or a config.

A database URL carries its password (``postgresql+psycopg://user:PASSWORD@host/db``); error messages,
the command line's echo, log files and the trackers' config show it as SQLAlchemy's own
``render_as_string(hide_password=True)`` does: ``postgresql+psycopg://user:***@host/db``. A
password given as a URL query parameter (``?password=...``) and a ``key=value`` whose key names a
secret are hidden the same way. In a config, every string that is such a URL is redacted and every
key whose name says password, secret, token or api key gets ``***`` (``None`` and ``""`` stay: they
show that nothing is set).

Redaction errs on the side of hiding. A value that is one URL (a config entry, a printed path) is
read as SQLAlchemy reads it (``user:password@`` up to the first ``@``; a password may hold spaces,
quotes, ``:`` and ``/``); when its host would hold an ``@`` too (an unescaped ``@`` in the password),
everything up to the URL's last ``@`` is hidden, and ``scheme://user:x`` with no ``@`` hides ``x``
unless it is a port number. In free text (a log line, an error), a password runs to the last ``@``
of its line before the next URL. Two catch-alls back up the printers that redact their own text:
:class:`RedactingFilter` on every logging handler (console, ``logs/driver.log``, the workers' logs) and
:func:`redacted_console`, which passes what a command line writes to ``sys.stdout``/``sys.stderr``
(Hydra's ``Error executing job with overrides: [...]`` line, its ``--cfg`` print) through
:func:`redact_text`.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, TextIO

__all__ = ["REDACTED", "RedactingFilter", "is_secret_key", "redact_config", "redact_text", "redact_url",
           "redacted_console"]

REDACTED = "***"

_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# A whole value that is a URL, split as SQLAlchemy's make_url splits it: user ':' password (to the first '@').
_WHOLE_URL = re.compile(r"(?P<head>" + _SCHEME + r"[^:/]*:)(?P<password>[^@]*)@(?P<rest>.*)", re.S)
# A whole URL without '@': scheme://user:PASSWORD (a host's port when it is a number).
_NO_AT_URL = re.compile(r"(?P<head>" + _SCHEME + r"[^:/@?#\[]*:)(?P<password>[^/?#@]*)(?P<rest>[^@]*)", re.S)
# In free text: scheme://user:PASSWORD@ -- the password runs to the last '@' of its line before the next URL.
_USERINFO = re.compile(r"(?P<head>\b" + _SCHEME + r"[^\s:/@'\"]*:)(?P<password>(?:(?!" + _SCHEME + r")[^\n])*)(?=@)")
_PORT_AND_PATH = re.compile(r"\d+(?:[/?#]\S*)?")
# In free text, a URL without '@': scheme://user:PASSWORD (a word that is not a port number).
_NO_AT_IN_TEXT = re.compile(r"(?P<head>\b" + _SCHEME + r"[^\s:/@'\"\[]*:)(?P<password>[^\s/?#@'\"]*)"
                            r"(?=[\s'\"/?#]|$)(?![^\s'\"]*@)")
_SECRET_PARAM = r"(?:password|passwd|pwd|secret|token|access_token|auth_token|api_key|apikey|sslpassword)"
# ?password=...&... in a URL's query string
_QUERY_SECRET = re.compile(r"(?P<head>[?&]" + _SECRET_PARAM + r"=)(?P<value>[^&\s'\"#]+)", re.IGNORECASE)
# key=value (a command-line override, a log line) whose key's last part names a secret
_KEY_VALUE = re.compile(r"(?P<head>(?<![\w.\-])[+~]{0,2}(?P<key>[A-Za-z_][\w.\-]*)=)"
                        r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",\]]+)")
# key: value -- a line of YAML (a printed config) whose key names a secret
_YAML_LINE = re.compile(r"^(?P<head>[ \t]*(?:- )?(?P<key>[A-Za-z_][\w.\-]*):[ \t]+)(?P<value>[^\n]*?)[ \t]*$", re.M)
_NO_VALUE = frozenset({"", "null", "~", "''", '""'})

_SECRET_WORDS = frozenset({"password", "passwd", "pwd", "secret", "secrets", "apikey", "credential",
                           "credentials", "passphrase"})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("secret", "key"), ("access", "key")})
# A tokenizer's special tokens are text, not credentials (``pad_token: <pad>``).
_SPECIAL_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "image", "stop"})


def is_secret_key(name: Any) -> bool:
    """True when a config key's name says it holds a credential: password, secret, api key, or a
    token that is not a tokenizer's special token (``hf_token`` yes, ``pad_token``/``max_tokens`` no)."""
    if not isinstance(name, str):
        return False
    words = [w for w in re.split(r"[_\-.\s]+", name.split(".")[-1].lower()) if w]
    if not words:
        return False
    if _SECRET_WORDS.intersection(words) or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:])):
        return True
    return words[-1] == "token" and (len(words) == 1 or words[-2] not in _SPECIAL_TOKENS)


def redact_url(url: str) -> str:
    """``url`` with its password hidden: ``scheme://user:***@host/db`` (a password query parameter too);
    anything that holds no password comes back unchanged. A string that is not one URL (text holding
    URLs) is redacted as free text (see the module docstring)."""
    if "\n" in url or not re.match(_SCHEME, url):
        return _redact_urls_in_text(url)
    whole = _WHOLE_URL.fullmatch(url)
    if whole is not None:
        host = re.split(r"[/?]", whole["rest"], maxsplit=1)[0]  # where make_url ends the host
        if "@" in host:  # an unescaped '@' in the password: SQLAlchemy would take its tail for the host
            shown = whole["head"] + REDACTED + "@" + url.rsplit("@", 1)[1]
        else:
            shown = whole["head"] + REDACTED + "@" + whole["rest"] if whole["password"] else url
    else:
        bare = _NO_AT_URL.fullmatch(url)
        shown = url if bare is None or re.fullmatch(r"\d*", bare["password"]) else \
            bare["head"] + REDACTED + bare["rest"]
    return _QUERY_SECRET.sub(_hide("head"), shown)


def _redact_urls_in_text(text: str) -> str:
    """Every URL's password in ``text`` hidden (see the module docstring)."""
    def hide(match: re.Match) -> str:
        password = match["password"]
        if not password:
            return match[0]
        first = re.split(r"[\s'\"]", password, maxsplit=1)[0]
        if first != password and _PORT_AND_PATH.fullmatch(first):  # host:port/path, then other words
            return match[0]
        return match["head"] + REDACTED
    def hide_bare(match: re.Match) -> str:
        return match[0] if re.fullmatch(r"\d*", match["password"]) else match["head"] + REDACTED
    return _QUERY_SECRET.sub(_hide("head"), _NO_AT_IN_TEXT.sub(hide_bare, _USERINFO.sub(hide, text)))


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line, a list of overrides, a printed YAML config) with every
    URL's password and the value of every ``key=value`` / ``key: value`` whose key names a secret hidden."""
    text = _KEY_VALUE.sub(lambda m: m["head"] + REDACTED if is_secret_key(m["key"]) else m[0],
                          _redact_urls_in_text(text))
    return _YAML_LINE.sub(lambda m: m["head"] + REDACTED if is_secret_key(m["key"]) and m["value"] not in _NO_VALUE
                          else m[0], text)


def redact_config(tree: Any) -> Any:
    """A copy of a config container (dicts, lists, a ``DictConfig``) with every URL's password hidden
    and every value of a key that names a secret replaced by ``***``; the input is not changed."""
    if isinstance(tree, Mapping):
        return {key: _redact_entry(key, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)) or _is_list_config(tree):
        return [redact_config(value) for value in tree]
    return redact_url(tree) if isinstance(tree, str) else tree


def _redact_entry(key: Any, value: Any) -> Any:
    if is_secret_key(key) and value is not None and value != "":
        return REDACTED
    return redact_config(value)


def _is_list_config(value: Any) -> bool:
    try:
        from omegaconf import ListConfig
    except ImportError:
        return False
    return isinstance(value, ListConfig)


def _hide(head: str):
    """A ``re.sub`` replacement keeping group ``head`` and hiding what follows it (empty stays empty)."""
    return lambda m: m[head] + REDACTED if m[0] != m[head] else m[0]


class RedactingFilter(logging.Filter):
    """A handler filter that hides secrets in a record's message, traceback and stack before any
    handler formats it (the record is shared: every handler then prints the redacted text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: logging reports it when it formats it
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:  # what Formatter.formatException would write
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


class _RedactingStream:
    """A text stream whose ``write`` passes the text through :func:`redact_text`; everything else is
    the wrapped stream's (``fileno``, ``isatty``, ``encoding``, ``flush``)."""

    def __init__(self, stream: TextIO):
        self.wrapped = stream

    def write(self, text: str) -> int:
        return self.wrapped.write(redact_text(text) if isinstance(text, str) else text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@contextmanager
def redacted_console() -> Iterator[None]:
    """Within: what is written to ``sys.stdout`` and ``sys.stderr`` has its secrets hidden (a URL's
    password, a secret-named key's value). Writes that bypass them (a child process, a C library)
    are not seen."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, _RedactingStream) else _RedactingStream(s) for s in saved)
    installed = sys.stdout, sys.stderr
    try:
        yield
    finally:  # put back what was there, unless someone replaced ours meanwhile
        if sys.stdout is installed[0]:
            sys.stdout = saved[0]
        if sys.stderr is installed[1]:
            sys.stderr = saved[1]
