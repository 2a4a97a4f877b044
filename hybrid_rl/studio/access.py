"""Who may use the studio: a token per start, the bind address, the peer, the Host and Origin headers.

A run launched from the studio executes code (a reward file, ``trust_remote_code``), so every
request but the page and its scripts needs the studio's token (Jupyter's pattern): a random one per
start (``secrets.token_urlsafe``), printed in the URL the studio logs, ``http://127.0.0.1:PORT/?token=...``.
Opening that URL sets a cookie (HttpOnly, SameSite=Strict) for the page's own requests; other
clients send ``X-Studio-Token: <token>`` or ``Authorization: token <token>``. Which checks apply is
decided from the address the server binds, never from the request's Host header:

* a loopback bind (the default): the peer must be a loopback address, and the Host header a
  loopback name (a page of another site reaching the port through DNS rebinding gets a 403);
* any other bind only with ``allow_remote`` (``--allow-remote``): any peer and Host, the token still
  on every request.

State-changing requests from another page's origin are refused whatever the token. A request that
fails inside a route is answered 400 with one line, never 500.
"""

# no `from __future__ import annotations`: FastAPI reads the page route's `Request` annotation at runtime
import ipaddress
import logging
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlsplit

__all__ = ["Access", "TOKEN_ENV", "add_guard", "is_loopback", "new_token"]

logger = logging.getLogger(__name__)

TOKEN_ENV = "HYBRID_RL_STUDIO_TOKEN"
"""Environment variable holding a fixed token (``--token`` does the same); unset = a random one per start."""
MIN_TOKEN_LENGTH = 16
"""Shortest fixed token accepted (a random one is 43 characters)."""
PUBLIC_PATHS = ("/", "/favicon.ico")
"""Paths answered without the token (the page itself; everything it fetches needs the token)."""
PUBLIC_PREFIX = "/static/"
"""The page's scripts and styles, also answered without the token (they hold no data)."""


def new_token() -> str:
    """A random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` when it is long enough to guess no better than a random one; ValueError otherwise."""
    if len(token) < MIN_TOKEN_LENGTH or not token.isascii() or any(c.isspace() for c in token):
        raise ValueError(f"the studio's token (--token or {TOKEN_ENV}) must be at least {MIN_TOKEN_LENGTH} "
                         "ASCII characters without spaces. Fix: leave both unset for a random token, or use "
                         "python -c 'import secrets; print(secrets.token_urlsafe())'")
    return token


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (127.0.0.0/8, ::1); a name is
    resolved (``localhost``), an unresolvable one is not loopback."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _is_loopback_address(address: Optional[str]) -> bool:
    """Whether a peer address (an IP literal, as the server reports it) is loopback; no name is resolved."""
    try:
        return address is not None and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


_HOST = re.compile(r"(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::[0-9]{1,5})?")
"""A Host header: a name or IPv4 address, or a bracketed IPv6 address, and an optional port; nothing else."""


def _host_name(header: str) -> str:
    """The name of a Host header, without its port (``[::1]:8080`` -> ``::1``); a header that is no
    ``host[:port]`` (``127.0.0.1:80@evil.com``) comes back whole, which no check accepts."""
    match = _HOST.fullmatch(header)
    return (match.group("ip6") or match.group("name")) if match else header


@dataclass(frozen=True)
class Access:
    """The studio's token and how it is bound."""

    token: str
    """The token every request but the page needs."""
    bind_host: str = "127.0.0.1"
    """The address the server binds: a loopback one unless ``allow_remote``."""
    allow_remote: bool = False
    """Serve a non-loopback ``bind_host`` (``--allow-remote``)."""
    cookie: str = "hybrid_rl_studio_token"
    """The cookie the token URL sets (its name carries the port, so two studios on one machine keep theirs)."""

    local: bool = field(init=False)
    """Whether the bind address is loopback: decided once, from the address, never from a request."""

    def __post_init__(self) -> None:
        check_token(self.token)
        object.__setattr__(self, "local", is_loopback(self.bind_host))
        if not self.local and not self.allow_remote:
            raise ValueError(f"--host {self.bind_host} is not a loopback address: anyone who can reach this machine "
                             "could use the studio, which launches runs that execute code. Fix: keep --host 127.0.0.1 "
                             "(from another machine: ssh -L 8080:127.0.0.1:8080 this-machine), or add --allow-remote "
                             "to serve the network (every request then needs the token)")

    def given(self, request: Any) -> Optional[str]:
        """The token a request carries: ``X-Studio-Token``, ``Authorization: token|Bearer X`` or the cookie."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip()
        return request.headers.get("x-studio-token") or request.cookies.get(self.cookie)

    def matches(self, given: Optional[str]) -> bool:
        """Whether ``given`` is the token (a constant-time comparison)."""
        return given is not None and secrets.compare_digest(given.encode("utf-8"), self.token.encode("utf-8"))

    def refusal(self, request: Any) -> Optional[tuple[int, str]]:
        """``(status, message)`` when the request is refused, else None."""
        if self.local:
            peer = request.client.host if request.client else None
            if not _is_loopback_address(peer):
                return 403, f"the studio serves this machine only; {peer} is not a loopback address"
            host = _host_name(request.headers.get("host", ""))
            if not (_is_loopback_address(host) or host in ("localhost", self.bind_host)):  # no name is resolved
                return 403, f"host {host!r} is not served; open the studio at http://127.0.0.1 (the URL it printed)"
        path = request.url.path
        if path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIX) and not self.matches(self.given(request)):
            return 401, ("this request needs the studio's token: open the URL the studio printed "
                         "(http://HOST:PORT/?token=...), or send the header X-Studio-Token: <token>")
        origin = request.headers.get("origin")
        if request.method not in ("GET", "HEAD") and origin and urlsplit(origin).netloc != request.headers.get("host"):
            return 403, "requests from another page are refused"
        return None


def add_guard(app: Any, access: Access) -> None:
    """The middleware that applies :meth:`Access.refusal` to every request and answers a failure
    inside a route with 400 and one line (logged with its traceback) instead of 500."""
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def guard(request: Any, call_next: Any) -> Any:
        refused = access.refusal(request)
        if refused is not None:
            return JSONResponse({"error": refused[1]}, status_code=refused[0])
        try:
            return await call_next(request)
        except Exception as error:  # noqa: BLE001 (bad input must never be a 500)
            logger.warning("studio: %s %s failed", request.method, request.url.path, exc_info=True)
            message = str(error).splitlines()[0] if str(error) else ""
            return JSONResponse({"error": f"the studio could not handle this request: {type(error).__name__}: "
                                          f"{message}"[:500]}, status_code=400)


def add_page(app: Any, access: Access, page_file: Any) -> None:
    """``GET /``: the page; ``/?token=X`` with the right token sets the cookie and redirects to ``/``
    (the token leaves the address bar), a wrong one is a 401."""
    from fastapi import Request
    from fastapi.responses import FileResponse, JSONResponse, RedirectResponse

    @app.get("/", include_in_schema=False, response_model=None)
    def page(request: Request) -> Any:
        token = request.query_params.get("token")
        if token is None:
            return FileResponse(page_file)
        if not access.matches(token):
            return JSONResponse({"error": "wrong token: open the URL the studio printed when it started"},
                                status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(access.cookie, access.token, httponly=True, samesite="strict", path="/")
        return response
