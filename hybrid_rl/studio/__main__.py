"""``python -m hybrid_rl.studio [--port 8080] [--host 127.0.0.1]``: serve the config studio locally.

Open the URL it logs (``http://127.0.0.1:8080/?token=...``): every request but the page needs that
token. The studio reads and runs code only inside the folder it starts in (and ``--root`` folders).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger("hybrid_rl.studio")


def _parser() -> argparse.ArgumentParser:
    from hybrid_rl.studio.access import TOKEN_ENV

    parser = argparse.ArgumentParser(prog="python -m hybrid_rl.studio", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; the default serves this machine only (a non-loopback one needs "
                             "--allow-remote)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="serve a non-loopback --host (0.0.0.0, a LAN address): anyone who reaches the port "
                             "and holds the token can launch runs, which execute code")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None,
                        help=f"a fixed token (also ${TOKEN_ENV}); default: a random one per start")
    parser.add_argument("--root", action="append", default=[], metavar="DIR",
                        help="a folder the studio may read and run code from, besides the one it starts in "
                             "(repeatable)")
    parser.add_argument("--plugins", nargs="+", default=[], metavar="FILE",
                        help="Python files that register estimators, losses, rewards or tools (imported "
                             "first: their names appear among the choices, and launched runs import them)")
    return parser


def _url(host: str, port: int, token: str) -> str:
    """The URL to open: the bind address (this machine's name for a wildcard bind) and the token."""
    import socket

    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/?token={token}"


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        import uvicorn

        from hybrid_rl.studio.access import Access, new_token
    except ImportError as error:
        sys.exit(f"the studio needs FastAPI and uvicorn ({error.name} is missing). "
                 "Fix: pip install 'hybrid_rl[studio]'")
    token = args.token or new_token()
    try:  # the bind and the token first: a refused --host costs no import of the config
        Access(token=token, bind_host=args.host, allow_remote=args.allow_remote)
        from hybrid_rl.studio.server import create_app

        app = create_app(token, bind_host=args.host, allow_remote=args.allow_remote, roots=tuple(args.root),
                         plugins=tuple(args.plugins), port=args.port)
    except ValueError as error:
        print(f"hybrid_rl studio: {error}", file=sys.stderr)
        sys.exit(2)
    if args.allow_remote:
        logger.warning("hybrid_rl studio: serving the network on %s:%d (--allow-remote). Anyone who reaches this "
                       "port and holds the token can launch runs, which execute code; the traffic is not encrypted.",
                       args.host, args.port)
    logger.info("hybrid_rl studio, serving %s: open %s", ", ".join(str(r) for r in app.state.workspace.roots),
                _url(args.host, args.port, token))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
