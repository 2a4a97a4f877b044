"""``python -m hybrid_rl.studio [--port 8080] [--host 127.0.0.1]``: serve the config studio locally."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hybrid_rl.studio", description=__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; the default serves this machine only")
    parser.add_argument("--plugins", nargs="+", default=[], metavar="FILE",
                        help="Python files that register estimators, losses, rewards or tools (imported "
                             "first: their names appear among the choices, and launched runs import them)")
    args = parser.parse_args(argv)
    try:
        import uvicorn

        from hybrid_rl.studio.server import create_app
    except ImportError as error:
        sys.exit(f"the studio needs FastAPI and uvicorn ({error.name} is missing). "
                 "Fix: pip install 'hybrid_rl[studio]'")
    print(f"hybrid_rl studio on http://{args.host}:{args.port}", flush=True)
    from hybrid_rl.studio.server import LOCAL_HOSTS

    hosts = LOCAL_HOSTS + ((args.host,) if args.host not in LOCAL_HOSTS else ())
    try:
        app = create_app(hosts, plugins=tuple(args.plugins))
    except ValueError as error:
        sys.exit(str(error))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
