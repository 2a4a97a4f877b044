"""benchmarks/gpu_check.py and scripts/gpu_payload.py (issue #39): the check's arithmetic on hand-made
results, its CPU run end to end without Ray or vLLM (as on the bare GPU machine), and the payload's
size limit."""

import json
import os
import subprocess
import sys
import time
import types

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import gpu_check  # noqa: E402
import gpu_payload  # noqa: E402


def test_pytest_summary_lines_are_counted():
    assert gpu_check.pytest_counts("..s\n3 passed, 2 skipped, 24 deselected in 9.1s\n") == {
        "passed": 3, "skipped": 2, "deselected": 24}
    assert gpu_check.pytest_counts("F\n1 failed, 4 passed, 1 error in 3.00s") == {"failed": 1, "passed": 4, "error": 1}
    assert gpu_check.pytest_counts("") == {}


def _results(ours_step=2.0, trl_step=7.0, mfus=(0.45, 0.5), rss=(3.0, 3.5), passed=5):
    ours = {"figures": {"median": {"step_s": ours_step}, "peak_rss_gib": rss[0]}}
    mfu = {"figures": {"median": {"step_s": 9.0, "update_actor_mfu_bfloat16": mfus[0], "ref_mfu_bfloat16": mfus[1]},
                       "peak_rss_gib": rss[1]}}
    return {"pytest": {"rc": 0, "counts": {"passed": passed}}, "ours": ours,
            "trl": {"figures": {"median": {"step_s": trl_step}}}, "mfu": mfu, "profile": {}}


def test_targets_hold_or_not_by_hand():
    t = gpu_check.targets(_results())
    assert t["speedup_vs_trl"]["value"] == pytest.approx(3.5) and t["speedup_vs_trl"]["holds"] is True
    assert t["mfu_1b"]["holds"] is True and t["host_rss_gib"]["value"] == 3.5 and t["host_rss_gib"]["holds"]
    assert t["pytest_gpu"]["holds"] is True
    t = gpu_check.targets(_results(ours_step=3.0, trl_step=6.0, mfus=(0.39, 0.6), rss=(4.5, 1.0), passed=0))
    assert t["speedup_vs_trl"]["value"] == pytest.approx(2.0) and t["speedup_vs_trl"]["holds"] is False
    assert t["mfu_1b"]["holds"] is False  # the lower of the two passes decides
    assert t["host_rss_gib"]["holds"] is False
    assert t["pytest_gpu"]["holds"] is None  # nothing passed: nothing was checked
    missing = _results()
    missing["trl"] = {"skipped": "TRL (trl, datasets) is not installed"}
    assert gpu_check.targets(missing)["speedup_vs_trl"] == {"value": None, "target": ">= 3.0x", "holds": None}


def test_gpu_test_files_are_the_marked_ones():
    files = gpu_check.gpu_test_files()
    assert "tests/workers/test_attention_kernels.py" in files and "tests/trainer/test_single_process_gpu.py" in files
    assert "tests/trainer/test_single_process.py" not in files


@pytest.mark.timeout(1800)
def test_cpu_run_of_the_check_needs_no_ray_and_writes_its_table(tmp_path):
    """The same code paths as on a GPU, smoke-sized, with Ray and vLLM made unimportable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nfor m in ('ray', 'vllm'):\n    sys.modules[m] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), REPO])}
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny", "--out", str(out),
                             "--sections", "pytest,ours,mfu,profile", "--work", str(tmp_path / "work"),
                             "--budget-s", "1700"],  # the default 480 s is a GPU's; a loaded 2-core CPU needs more
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=1750)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    sections = report["sections"]
    assert all(sections[s]["rc"] == 0 for s in ("pytest", "ours", "mfu", "profile")), sections
    assert sections["trl"] == {"skipped": "not chosen (--sections)"}
    assert sections["ours"]["summary"]["step_s"] > 0 and sections["ours"]["figures"]["device"] == "cpu"
    ours = sections["ours"]["summary"]  # the host memory figures of bench_step.RssMonitor
    assert 0 < ours["host_steady_rss_gib"] <= ours["host_rss_gib"] and 0 < ours["host_pss_gib"]
    assert sections["profile"]["summary"]["update_actor_kernel_launches"] > 0
    assert sections["profile"]["summary"]["update_actor_fsdp2_root_wall_s"] > 0  # the trainer's FSDP2 actor too
    table = (out / "gpu_check.md").read_text()
    assert "| ours | rc 0 |" in table and "| speedup_vs_trl | not measured |" in table
    choices = sections["ours"]["figures"]["worker_choices"]  # what the workers logged at start-up
    assert any(c.startswith("FSDP2 groups: ") for c in choices) and any(c.startswith("precision on cpu") for c in choices)
    assert "Worker choices in `ours`:" in table and "- packed attention: rows by sdpa" in table
    assert "===== ours:" in (out / "gpu_check.log").read_text()


def test_a_section_without_budget_left_is_skipped(tmp_path):
    runner = gpu_check.Runner(tmp_path, budget_s=5.0, limits={"ours": 100})
    assert "skipped" in runner.run("ours", [sys.executable, "-c", "print(1)"])
    runner = gpu_check.Runner(tmp_path, budget_s=600.0, limits={"ours": 100})
    assert runner.run("ours", [sys.executable, "-c", "print('hello')"])["rc"] == 0


class _StartedPopen(subprocess.Popen):
    """A child whose deadline counts from the moment it says it is inside its section (it creates the
    file ``ready``), not from its start: interpreter start-up on a loaded machine takes any time."""

    ready = None

    def wait(self, timeout=None):
        if timeout is not None and not getattr(self, "_started", False):
            while not self.ready.exists() and self.poll() is None:
                time.sleep(0.05)
            self._started = True
        return super().wait(timeout=timeout)


def test_a_section_past_its_deadline_is_interrupted_and_keeps_its_output(tmp_path, monkeypatch):
    """A child that would block forever gets SIGINT at its (1 s) deadline and prints its summary; a
    child that ignored the SIGINT would be killed GRACE_S later, without the summary (the test fails)."""
    ready = tmp_path / "ready"
    monkeypatch.setattr(_StartedPopen, "ready", ready)
    monkeypatch.setattr(gpu_check, "subprocess", types.SimpleNamespace(
        Popen=_StartedPopen, TimeoutExpired=subprocess.TimeoutExpired, STDOUT=subprocess.STDOUT))
    monkeypatch.setattr(gpu_check, "GRACE_S", 120.0)  # time to print after SIGINT, however loaded the machine
    runner = gpu_check.Runner(tmp_path, budget_s=600.0, limits={"pytest": 1.0}, min_start_s=0.5)
    child = ("import pathlib, sys, time\ntry:\n    print('started', flush=True)\n"
             "    pathlib.Path(sys.argv[1]).touch()\n    while True:\n        time.sleep(1)\n"
             "except KeyboardInterrupt:\n    print('summary after SIGINT', flush=True)\n")
    result = runner.run("pytest", [sys.executable, "-c", child, str(ready)])
    assert result["rc"] is None and ready.exists()
    assert "started" in result["output"] and "summary after SIGINT" in result["output"]
    assert result["output"].endswith("[gpu_check] pytest: deadline 1 s\n")


def test_payload_plus_tree_fits_one_transfer(tmp_path):
    line = gpu_payload.check_size()  # with the payload where it was built here; the tree alone otherwise
    assert "limit 60" in line
    tree, _ = gpu_payload.transfer_mib()
    assert 0 < tree < 20
    fake = tmp_path / "payload"
    fake.mkdir()
    (fake / "big.whl").write_bytes(b"\0" * int((gpu_payload.LIMIT_MIB - tree + 1) * 2**20))
    with pytest.raises(ValueError, match="too large for one device transfer"):
        gpu_payload.check_size(payload=fake)


def test_payload_pins_one_version_of_each_name():
    names = [n.lower().replace("_", "-") for n in list(gpu_payload.WHEELS) + list(gpu_payload.BUILT)]
    assert len(names) == len(set(names))
    assert {"hydra-core", "omegaconf", "tensordict", "codetiming", "trl", "datasets"} <= set(names)
    assert not {"ray", "vllm"} & set(names)  # the one-process check runs without them
