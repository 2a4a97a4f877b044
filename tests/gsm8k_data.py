"""The real GSM8K for the tests that need it, found as a user's run finds it (scripts/data/gsm8k.py).

In order: the folder ``$GSM8K_DIR`` when that is set (the recipes' variable), else ``../shared/data/gsm8k``
beside the checkout; a folder counts when it holds ``train.jsonl`` and ``test.jsonl``. Without one,
``openai/gsm8k`` from the datasets cache (what ``python scripts/data/gsm8k.py`` downloads once; the
suite runs with ``HF_HUB_OFFLINE=1``, so a test never downloads). Where none is there the test is
skipped, saying what was looked at. ``GSM8K_DIR=/nonexistent`` shows what a clean clone without
``../shared`` does.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = "GSM8K_DIR"
SHARED = REPO.parent / "shared" / "data" / "gsm8k"


def script() -> ModuleType:
    """scripts/data/gsm8k.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("gsm8k_script", REPO / "scripts" / "data" / "gsm8k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def local_folder() -> Path:
    """The folder looked at first: ``$GSM8K_DIR`` when set and not empty, else ``../shared/data/gsm8k``."""
    return Path(os.environ[ENV]).expanduser() if os.environ.get(ENV) else SHARED


def source() -> dict:
    """``convert``/``read_splits`` keyword arguments for the real GSM8K (see the module), or a skip that
    names the folder and the reason the hub copy could not be read."""
    folder = local_folder()
    if all((folder / f"{split}.jsonl").is_file() for split in ("train", "test")):
        return {"input_dir": str(folder)}
    try:
        script().load_hub()  # from the datasets cache: the suite is offline
    except ValueError as err:
        pytest.skip(f"no GSM8K here: {folder} has no train.jsonl/test.jsonl (set {ENV} to a folder that "
                    f"has them) and {err}")
    return {}


class FakeDatasets(ModuleType):
    """A stand-in ``datasets`` module: ``load_dataset`` records its arguments and returns ``splits``
    (or raises ``error``), for the tests of the hub path (no hub is reachable from the suite)."""

    def __init__(self, splits=None, error=None):
        super().__init__("datasets")
        self.calls, self.splits, self.error = [], splits, error

    def load_dataset(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.error:
            raise self.error
        return self.splits
