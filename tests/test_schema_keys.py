"""Every DataProto key the package writes or reads is in the batch schema (hybrid_rl/schema.py).

The package's source is parsed (not imported) and each place that names a key on a DataProto is
collected: ``x.batch["k"]`` / ``x.non_tensor_batch["k"]`` / ``x.meta_info["k"]`` (also through a local
alias such as ``tensors = data.batch``, and a ``non_tensor_batch`` / ``meta_info`` parameter), their
``get`` / ``pop`` / ``setdefault`` / ``update``, ``"k" in x.batch`` (``.keys()``), the dicts given to
``DataProto.from_dict`` / ``DataProto(...)`` (a literal, or a local dict built with literal keys), and
``batch_keys=`` / ``non_tensor_batch_keys=`` / ``meta_info_keys=`` lists (a literal or a module
constant). A key built at run time (``f"reward_extra_{k}"``) is a family entry of the schema.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hybrid_rl.schema import BATCH_SCHEMA, lookup

PACKAGE = Path(__file__).resolve().parents[1] / "hybrid_rl"
PARTS = ("batch", "non_tensor_batch", "meta_info")
PART_PARAMETERS = ("non_tensor_batch", "meta_info")  # a parameter of that name holds that part
KEY_LISTS = {"batch_keys": "batch", "non_tensor_batch_keys": "non_tensor_batch", "meta_info_keys": "meta_info"}
DICT_SLOTS = {"tensors": "batch", "batch": "batch", "non_tensors": "non_tensor_batch",
              "non_tensor_batch": "non_tensor_batch", "meta_info": "meta_info"}


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _strings(node, constants: dict[str, list[str]]) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for s in map(_str, node.elts) if s is not None]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.left, constants) + _strings(node.right, constants)
    return constants.get(node.id, []) if isinstance(node, ast.Name) else []


def _dict_keys(node) -> list[str]:
    if isinstance(node, ast.Dict):
        return [s for s in map(_str, node.keys) if s is not None]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return [kw.arg for kw in node.keywords if kw.arg]
    return []


class _Scope:
    """One function (or a module's top level): its part aliases and locally built dicts."""

    def __init__(self, nodes: list[ast.AST]):
        self.nodes = nodes
        self.aliases: dict[str, str] = {}
        self.built: dict[str, list[str]] = {}
        for node in nodes:
            self._learn(node)

    def _learn(self, node) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    if isinstance(node.value, ast.Attribute) and node.value.attr in PARTS:
                        self.aliases[target.id] = node.value.attr
                    self.built.setdefault(target.id, []).extend(_dict_keys(node.value))
                elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and _str(target.slice):
                    self.built.setdefault(target.value.id, []).append(_str(target.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name):
            keys = [kw.arg for kw in node.keywords if kw.arg] + [k for a in node.args for k in _dict_keys(a)]
            self.built.setdefault(node.func.value.id, []).extend(keys)

    def part(self, node) -> str | None:
        """The DataProto part ``node`` is (``x.batch``, ``x.batch.keys()``, an alias), or None."""
        if isinstance(node, ast.Attribute) and node.attr in PARTS:
            return node.attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
            return self.part(node.func.value)
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id) or (node.id if node.id in PART_PARAMETERS else None)
        return None


def _uses(scope: _Scope, node, constants) -> list[tuple[str, str]]:
    """``(part, key)`` named on a DataProto by ``node``."""
    if isinstance(node, ast.Subscript) and _str(node.slice) and scope.part(node.value):
        return [(scope.part(node.value), _str(node.slice))]
    if isinstance(node, ast.Compare) and _str(node.left):
        return [(scope.part(c), _str(node.left)) for op, c in zip(node.ops, node.comparators)
                if isinstance(op, (ast.In, ast.NotIn)) and scope.part(c)]
    if not isinstance(node, ast.Call):
        return []
    out = [(KEY_LISTS[kw.arg], k) for kw in node.keywords if kw.arg in KEY_LISTS
           for k in _strings(kw.value, constants)]
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if isinstance(func, ast.Attribute) and scope.part(func.value):
        part = scope.part(func.value)
        if name in ("get", "pop", "setdefault") and node.args and _str(node.args[0]):
            out.append((part, _str(node.args[0])))
        elif name == "update":
            out += [(part, kw.arg) for kw in node.keywords if kw.arg]
            out += [(part, k) for a in node.args for k in _dict_keys(a)]
    if name in ("from_dict", "DataProto"):
        slots = list(zip(PARTS, node.args)) + [(DICT_SLOTS[kw.arg], kw.value) for kw in node.keywords
                                                if kw.arg in DICT_SLOTS]
        for part, arg in slots:
            keys = scope.built.get(arg.id, []) if isinstance(arg, ast.Name) else _dict_keys(arg)
            out += [(part, k) for k in keys]
    return out


def _module_constants(tree: ast.Module) -> dict[str, list[str]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _strings(node.value, out)
            if values:
                out[node.targets[0].id] = values
    return out


def package_key_uses(root: Path = PACKAGE) -> list[tuple[str, str, str]]:
    """``(part, key, "file:line")`` of every key named on a DataProto in the package's source."""
    uses = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        constants = _module_constants(tree)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for body in [f.body for f in functions] + [top]:
            scope = _Scope([n for stmt in body for n in ast.walk(stmt)])
            for node in scope.nodes:
                where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
                uses += [(part, key, where) for part, key in _uses(scope, node, constants)]
    return uses


def test_every_key_the_package_names_is_in_the_schema():
    uses = package_key_uses()
    assert len(uses) > 200  # the scan finds the package's uses (a broken scan finds none)
    bad = sorted({f"{part}[{key!r}] at {where}" for part, key, where in uses
                  if lookup(key) is None or lookup(key).part != part})
    assert not bad, "keys missing from hybrid_rl/schema.py (or listed in another part):\n" + "\n".join(bad)


def test_the_scan_finds_each_kind_of_use(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        'KEYS = ("a1", "a2")\n'
        "def f(data, non_tensor_batch):\n"
        '    x = data.batch["b1"]\n'
        "    t = data.batch\n"
        '    y = t["b2"], t.get("b3"), "b4" in data.batch.keys(), data.meta_info.pop("m1")\n'
        '    z = non_tensor_batch.get("n1")\n'
        '    out = {"b5": x}\n'
        '    out["b6"] = y\n'
        '    data.select(batch_keys=KEYS + ["a3"])\n'
        '    return DataProto.from_dict(out, non_tensors={"n2": z}, meta_info={"m2": 1})\n')
    found = {(part, key) for part, key, _ in package_key_uses(tmp_path / "pkg")}
    assert found == {("batch", k) for k in ("a1", "a2", "a3", "b1", "b2", "b3", "b4", "b5", "b6")} | {
        ("meta_info", "m1"), ("meta_info", "m2"), ("non_tensor_batch", "n1"), ("non_tensor_batch", "n2")}


@pytest.mark.parametrize("name", ["reward_extra_acc", "reward_extra_score"])
def test_a_family_matches_its_prefix_only(name):
    assert lookup(name).name == "reward_extra_*"
    assert lookup("reward_extra") is None and lookup("old_log_prob") is None  # typos stay unknown


def test_the_schema_lists_every_key_the_issue_named():
    names = {key.name for key in BATCH_SCHEMA}
    assert {"rollout_is_weights", "rm_scores", "rm_raw_scores", "teacher_log_prob", "teacher_topk_ids",
            "teacher_topk_log_probs", "reward_extra_*"} <= names
