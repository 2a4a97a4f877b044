"""Secrets out of everything printed or logged: one helper for every printer of a URL or a config.

A database URL carries its password (``postgresql+psycopg://user:PASSWORD@host/db``); error messages,
the command line's echo, log files and the trackers' config show it as SQLAlchemy's own
``render_as_string(hide_password=True)`` does: ``postgresql+psycopg://user:***@host/db``. A
password given as a URL query parameter (``?password=...``) and a ``key=value`` whose key names a
secret are hidden the same way. In a config, every string that is such a URL is redacted and every
key whose name says password, secret, token or api key gets ``***`` (``None`` and ``""`` stay: they
show that nothing is set).

Redaction errs on the side of hiding: a password holding an unescaped ``@`` hides up to the last
``@`` of the URL.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["REDACTED", "is_secret_key", "redact_config", "redact_text", "redact_url"]

REDACTED = "***"

# scheme://user:PASSWORD@ -- the password runs to the last '@' of the URL (quotes and spaces end it).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<password>[^\s'\"]*)(?=@)")
_SECRET_PARAM = r"(?:password|passwd|pwd|secret|token|access_token|auth_token|api_key|apikey|sslpassword)"
# ?password=...&... in a URL's query string
_QUERY_SECRET = re.compile(r"(?P<head>[?&]" + _SECRET_PARAM + r"=)(?P<value>[^&\s'\"#]+)", re.IGNORECASE)
# key=value (a command-line override, a log line) whose key's last part names a secret
_KEY_VALUE = re.compile(r"(?P<head>(?<![\w.\-])[+~]{0,2}(?P<key>[A-Za-z_][\w.\-]*)=)(?P<value>[^\s'\",\]]+)")

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
    anything that holds no password comes back unchanged."""
    return _QUERY_SECRET.sub(_hide("head"), _USERINFO.sub(_hide("head"), url))


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line, a list of overrides) with every URL's password and the
    value of every ``key=value`` whose key names a secret hidden."""
    text = redact_url(text)
    return _KEY_VALUE.sub(lambda m: m["head"] + REDACTED if is_secret_key(m["key"]) else m[0], text)


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
