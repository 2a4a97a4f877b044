"""Executes the Python blocks of docs/notebook.md, in order, in one namespace."""

import os
import re

import pytest

pytestmark = pytest.mark.slow

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "notebook.md")


def test_notebook_example_runs(monkeypatch, tmp_path):
    from hybrid_rl.reward import registered_data_sources, unregister_reward

    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", open(DOC).read(), flags=re.S)
    assert len(blocks) == 3
    namespace: dict = {}
    try:
        for block in blocks:
            exec(compile(block, DOC, "exec"), namespace)  # noqa: S102 - our own documentation
        assert namespace["trainer"].global_steps == 3
    finally:
        if "my_arithmetic" in registered_data_sources():
            unregister_reward("my_arithmetic")
