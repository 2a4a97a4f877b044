"""The house's floors: no module imports one from a floor above it, and the trainer's modes are
siblings (read from the source with ast, imports inside functions included)."""

import ast
import pathlib

import pytest

from hybrid_rl.trainer.modes import MODES as MODE_TABLE

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybrid_rl"

# every row of the modes' table: its package (the trainer's) is a mode, its command an entry point; the
# table and its one command-line path (trainer.modes) stand with the entry points, above the modes they run
MODES = tuple(sorted({spec.trainer.partition(":")[0].rsplit(".", 1)[0] for spec in MODE_TABLE.values()}))
ENTRY_POINTS = (*sorted(spec.entry_module for spec in MODE_TABLE.values()), "hybrid_rl.trainer.supervised_cli",
                "hybrid_rl.trainer.modes")
LOWER_FLOORS = ("hybrid_rl.algorithms", "hybrid_rl.protocol", "hybrid_rl.protocol_utils", "hybrid_rl.schema",
                "hybrid_rl.utils", "hybrid_rl.data", "hybrid_rl.reward", "hybrid_rl.buffer", "hybrid_rl.agents",
                "hybrid_rl.single_controller")
# (importer prefix, what it must never import): each line is one rule of docs/architecture.md
RULES = [
    *[(floor, ("hybrid_rl.trainer", "hybrid_rl.studio", "hybrid_rl.eval", "hybrid_rl.debug")) for floor in LOWER_FLOORS],
    ("hybrid_rl.workers", ("hybrid_rl.trainer", "hybrid_rl.studio")),
    # objectives: tensors and their own configs, below the workers that drive them
    ("hybrid_rl.objectives", ("hybrid_rl.workers", "hybrid_rl.trainer", "hybrid_rl.studio", "hybrid_rl.single_controller")),
    # the schemas, their loading, their documentation and the config checks stand below everything that
    # runs: the checks read configs only (their vocabulary -- resume modes, trackers, what one process
    # cannot host -- lives beside them); runtime facts are the core's (core/runtime_checks.py)
    ("hybrid_rl.trainer.config", (*MODES, *ENTRY_POINTS, "hybrid_rl.trainer.core")),
    ("hybrid_rl.trainer.core", (*MODES, *ENTRY_POINTS)),
    *[(mode, (*[m for m in MODES if m != mode], *ENTRY_POINTS)) for mode in MODES],  # modes are siblings
]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports; ``from a import b`` counts as ``a.b`` (b may be a submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("importer, forbidden", RULES, ids=[rule[0] for rule in RULES])
def test_no_import_runs_up_a_floor(importer, forbidden):
    broken = sorted(f"{module} imports {name}" for module, names in MODULES.items() if _within(module, importer)
                    for name in names if any(_within(name, f) for f in forbidden))
    assert not broken, broken


def test_the_rules_see_the_modules():
    """Each rule names modules that exist (a renamed folder must not make a rule vacuous)."""
    for importer, _ in RULES:
        assert any(_within(module, importer) for module in MODULES), importer
    assert "hybrid_rl.trainer.core.loop" in MODULES["hybrid_rl.trainer.ppo.trainer"]
    assert {"hybrid_rl.trainer.config.run_checks", "hybrid_rl.trainer.config.checks"} <= set(MODULES)
    assert all(entry in MODULES for entry in ENTRY_POINTS), ENTRY_POINTS
    assert {"hybrid_rl.trainer.ppo", "hybrid_rl.trainer.sft", "hybrid_rl.trainer.rm"} <= set(MODES), MODES
    assert {"hybrid_rl.trainer.main_ppo", "hybrid_rl.trainer.main_sft", "hybrid_rl.trainer.main_rm"} <= set(ENTRY_POINTS)


def _private_imports(path: pathlib.Path) -> set[str]:
    """``module._name`` for every ``from module import _name`` of ``path`` (a private helper)."""
    return {f"{node.module}.{alias.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")}


def test_no_module_imports_an_entry_points_private_helper():
    """Each entry point's shared code is :mod:`hybrid_rl.trainer.modes`' public functions."""
    found = sorted(f"{_module_name(path)} imports {name}" for path in sorted(PACKAGE.rglob("*.py"))
                   for name in _private_imports(path) if any(_within(name.rsplit(".", 1)[0], entry)
                                                              for entry in ENTRY_POINTS))
    assert not found, found


def test_the_private_import_probe_sees_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from hybrid_rl.trainer.main_ppo import _fail, build_trainer\n")
    assert _private_imports(probe) == {"hybrid_rl.trainer.main_ppo._fail"}
