"""``python -m hybrid_rl.studio.run_with_plugins FILE [FILE ...] -- <main_ppo arguments>``: import the
plugin files, then run ``main_ppo`` as its command line would (a one-process run's restart re-runs
this module, so the files are imported again there)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: python -m hybrid_rl.studio.run_with_plugins FILE [FILE ...] -- <main_ppo arguments>")
    split = argv.index("--")
    from hybrid_rl.studio.plugins import load_plugin_files

    try:
        load_plugin_files(argv[:split])
    except ValueError as error:
        sys.exit(str(error))
    from hybrid_rl.trainer.main_ppo import main as main_ppo

    sys.argv = ["hybrid_rl.trainer.main_ppo", *argv[split + 1:]]
    main_ppo()


if __name__ == "__main__":
    main(sys.argv[1:])
