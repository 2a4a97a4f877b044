"""Presets for the studio: the overrides each recipe's ``run.sh`` passes to ``main_ppo``.

A recipe is a shell script; its ``python -m hybrid_rl.trainer.main_ppo \\`` block is read as the
shell would split it (line continuations joined, quotes removed). Shell variables stay as written
(``$DATA/train.parquet``): the studio's check then names the file to fix.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Optional

from hybrid_rl.studio.form import parse_overrides

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""The repository's ``recipes/`` (a source checkout; an installed wheel has none)."""

_MAIN = "hybrid_rl.trainer.main_ppo"


def recipe_overrides(script: str, recipes_dir: Path = RECIPES_DIR) -> Optional[list[str]]:
    """The ``key=value`` words of the script's ``main_ppo`` command, or None when it runs none. A line
    ``bash recipes/<name>/run.sh key=value ...`` runs that recipe with the line's words appended."""
    text = script.replace("\\\n", " ")
    for line in text.splitlines():
        called = re.match(r"\s*(?:exec\s+)?bash\s+recipes/([\w.-]+)/run\.sh(\s|$)", line)
        if called:
            target = recipes_dir / called.group(1) / "run.sh"
            if not target.is_file():
                return None
            base = recipe_overrides(target.read_text(encoding="utf-8", errors="replace"), recipes_dir)
            words = shlex.split(line[called.end():], comments=True)
            return None if base is None else base + [w for w in words if "=" in w and not w.startswith("-")]
        if _MAIN not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        words = words[words.index(_MAIN) + 1:] if _MAIN in words else []
        return [w for w in words if "=" in w and not w.startswith("-")]
    return None


def load_presets(recipes_dir: Path = RECIPES_DIR) -> dict[str, dict[str, Any]]:
    """``{recipe name: {key: value}}`` for every ``recipes/*/run.sh`` that runs ``main_ppo``;
    ``{"default": {}}`` first (the default run)."""
    presets: dict[str, dict[str, Any]] = {"default": {}}
    for script in sorted(recipes_dir.glob("*/run.sh")):
        try:
            overrides = recipe_overrides(script.read_text(encoding="utf-8", errors="replace"), recipes_dir)
            if overrides is not None:
                presets[script.parent.name] = parse_overrides(overrides)
        except (ValueError, RecursionError):  # a recipe the parsers cannot read (or that runs itself) is left out
            continue
    return presets
