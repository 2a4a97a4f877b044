"""The code sandbox and the ``code_exec`` scorer: each misbehaviour scores 0 with its reason counted.

Every misbehaving program is bounded by itself too (a fork bomb forks at most 200 children, which
sleep and exit), and its process group is killed after the test, so a limit that failed cannot harm
the machine.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hybrid_rl.reward import NaiveRewardManager, default_compute_score
from hybrid_rl.reward import _sandbox_child
from hybrid_rl.reward.sandbox import FAILURE_REASONS, SandboxConfig, run_python
from hybrid_rl.reward.scorers import code_exec
from hybrid_rl.utils.testing import build_byte_tokenizer
from tests.reward.test_manager import make_batch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's limits are Linux's")

# The CPU limit stops busy programs; the wall clock is generous, since on a loaded shared machine even
# starting the interpreter can take seconds.
FAST = {"timeout_s": 15, "cpu_s": 1, "memory_mb": 256}
REVERSE = "```python\nprint(input()[::-1])\n```"
TESTS = {"inputs": ["abc\n", "xy\n"], "outputs": ["cba\n", "yx"]}
FORK_BOMB = """
import os, time
children = 0
for _ in range(200):  # bounded even if every fork succeeded
    try:
        if os.fork() == 0:
            time.sleep(20)
            os._exit(0)
        children += 1
    except OSError:
        pass
print(children)
"""
MISBEHAVIOURS = {
    "timeout": "while True:\n    pass",
    "memory": "hog = bytearray(1 << 31)",
    "processes": FORK_BOMB,
}


def _fenced(source: str) -> str:
    return f"Here it is:\n```python\n{textwrap.dedent(source)}\n```"


@pytest.fixture
def group_reaper():
    """Process groups to kill after the test, whatever happened."""
    groups = []
    yield groups
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_correct_solution_scores_one():
    out = code_exec.compute_score(REVERSE, TESTS, sandbox=FAST)
    assert (out["score"], out["acc"], out["tests_passed"], out["reason"]) == (1.0, True, 2, "ok")
    assert all(out[f"reward/sandbox/{r}"] == 0 for r in code_exec.ROW_REASONS)
    assert default_compute_score("code_exec", REVERSE, json.dumps(TESTS))["score"] == 1.0


def test_own_folder_is_writable():
    inside = run_python("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())", config=FAST)
    assert (inside.reason, inside.stdout) == ("ok", "ok\n")


def test_fork_bomb_leaves_no_process(group_reaper):
    result = run_python(textwrap.dedent(FORK_BOMB), config=FAST)
    group_reaper.append(result.pid)
    assert result.reason == "processes"
    assert not _group_alive(result.pid)


def test_landlock_refuses_a_write_the_audit_hook_cannot_see(tmp_path):
    # relative to a descriptor of another folder: the hook resolves "escaped" inside its own folder
    program = (f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
               "os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=fd)")
    result = run_python(program, config=FAST)
    if "landlock" not in result.layers:
        pytest.skip("this kernel has no Landlock: only the audit hook guards writes")
    assert result.reason == "forbidden_write"
    assert not (tmp_path / "escaped").exists()


def test_seccomp_refuses_fork_without_the_audit_hook():
    probe = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(_sandbox_child.__file__)!r})
        import _sandbox_child as child
        if not child._seccomp_no_processes(*child._libc()):
            print("unavailable"); sys.exit(0)
        try:
            pid = os.fork()
        except OSError as exc:
            print("refused", exc.errno); sys.exit(0)
        if pid == 0:
            os._exit(0)
        print("forked")
    """)
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=30).stdout
    if out.strip() == "unavailable":
        pytest.skip("no seccomp filter on this machine/architecture")
    assert out.split() == ["refused", "11"]  # EAGAIN, as RLIMIT_NPROC would answer


def test_cpu_time_limit_stops_a_busy_loop_before_the_wall_clock():
    result = run_python("while True:\n    pass", config={"timeout_s": 20, "cpu_s": 1})
    # SIGXCPU is the CPU limit's signal (the wall clock would SIGKILL); on a busy shared machine 1 s of
    # CPU may take several seconds of wall time
    assert (result.reason, result.returncode) == ("timeout", -signal.SIGXCPU)


def test_wall_clock_stops_a_sleeping_program():
    result = run_python("import time\ntime.sleep(60)", config={"timeout_s": 1})
    assert (result.reason, result.returncode) == ("timeout", -signal.SIGKILL)
    assert not _group_alive(result.pid)


def test_file_size_and_output_caps():
    big = run_python("open('big', 'wb').write(b'x' * 4096)", config={"max_file_bytes": 1024})
    assert big.reason == "file_size"
    chatty = run_python("while True:\n    print('y' * 100)", config={"max_output_bytes": 1000, "timeout_s": 5})
    assert chatty.reason == "file_size"
    assert len(chatty.stdout) + len(chatty.stderr) <= 1000


def test_placed_files_are_importable_and_not_counted_as_written():
    program = "from helper import seven\nprint(seven())  # " + "p" * 2000  # main.py past max_file_bytes
    result = run_python(program, config={**FAST, "max_file_bytes": 1024},
                        files={"helper.py": "def seven():\n    return 7\n"})
    assert (result.reason, result.stdout) == ("ok", "7\n")
    with pytest.raises(ValueError, match="'../x' must be a plain file name"):
        run_python("print(1)", files={"../x": ""})


def test_no_secret_reaches_the_child(monkeypatch):
    monkeypatch.setenv("HYBRID_RL_TEST_SECRET", "hunter2")
    monkeypatch.setenv("HYBRID_RL_TEST_ALLOWED", "shown")
    program = "import os\nprint(sorted(os.environ))\nprint(os.environ.get('HYBRID_RL_TEST_ALLOWED'))"
    result = run_python(program, config={**FAST, "env_allow": ["HYBRID_RL_TEST_ALLOWED"]})
    names, allowed = result.stdout.splitlines()
    assert "HYBRID_RL_TEST_SECRET" not in names and "hunter2" not in result.stdout
    assert allowed == "shown"
    assert eval(names) == ["HOME", "HYBRID_RL_TEST_ALLOWED", "LANG", "LC_ALL", "PATH", "TMPDIR"]


def test_asserts_wrong_answer_no_code_and_partial_credit():
    square = _fenced("def f(x):\n    return x * x")
    gt = {"asserts": ["assert f(2) == 4", "assert f(3) == 10", "assert f(0) == 0"]}
    assert code_exec.compute_score(square, gt, sandbox=FAST)["reason"] == "wrong_answer"
    partial = code_exec.compute_score(square, gt, sandbox=FAST, partial_credit=True)
    assert (partial["score"], partial["tests_passed"], partial["reason"]) == (2 / 3, 2, "wrong_answer")
    assert code_exec.compute_score("no code here", gt)["reason"] == "no_code"
    crash = code_exec.compute_score(_fenced("raise SystemExit(3)"), TESTS, sandbox=FAST)
    assert crash["reason"] == "error"


def test_bad_ground_truth_and_config_name_the_fix():
    with pytest.raises(ValueError, match=r'"inputs": \[stdin strings\]'):
        code_exec.parse_tests({"inputs": ["1"], "outputs": []})
    with pytest.raises(ValueError, match="not JSON"):
        code_exec.parse_tests("{oops")
    with pytest.raises(ValueError, match="memory_mb=8 is out of range"):
        SandboxConfig(memory_mb=8)
    with pytest.raises(ValueError, match=r"unknown sandbox config key\(s\) \['memroy_mb'\]"):
        SandboxConfig.of({"memroy_mb": 64})
    with pytest.raises(ValueError, match="give a list of variable names"):
        SandboxConfig(env_allow="HOME")


def test_manager_counts_reasons_and_other_rows_keep_their_scores(tmp_path):
    tokenizer = build_byte_tokenizer()
    escape = f"open({str(tmp_path / 'x')!r}, 'w')"
    responses = [REVERSE, _fenced(MISBEHAVIOURS["timeout"]), _fenced(MISBEHAVIOURS["memory"]), _fenced(FORK_BOMB),
                 _fenced(escape), "#### 7", REVERSE]
    sources = ["code_exec"] * 5 + ["arithmetic", "code_exec"]
    gts = [json.dumps(TESTS)] * 5 + [7, json.dumps(TESTS)]
    data = make_batch(tokenizer, responses, gts, sources=sources, resp_len=400)

    def score(data_source, solution_str, ground_truth, extra_info=None):  # the test's limits, else as built in
        if data_source != "code_exec":
            return default_compute_score(data_source, solution_str, ground_truth, extra_info)
        return code_exec.compute_score(solution_str, ground_truth, sandbox=FAST, max_total_s=60)

    out = NaiveRewardManager(tokenizer, num_examine=0, compute_score=score, timeout_s=120)(data, return_dict=True)
    info = out["reward_extra_info"]
    assert info["reason"][:5] == ["ok", "timeout", "memory", "processes", "forbidden_write"]
    for row, reason in enumerate(info["reason"][:5]):  # one counter per failed row, on its own reason
        counters = {r: info[f"reward/sandbox/{r}"][row] for r in code_exec.ROW_REASONS}
        assert counters == {r: int(r == reason) for r in code_exec.ROW_REASONS}
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    metrics = out["reward_metrics"]
    for reason in ("timeout", "memory", "processes", "forbidden_write"):
        assert metrics[f"reward/sandbox/{reason}"] == 1, reason
    assert metrics["reward/sandbox/error"] == metrics["reward/sandbox/wrong_answer"] == 0
    assert metrics["reward/num_failed"] == 0  # every row was scored: the misbehaviour is the program's
    assert not (tmp_path / "x").exists()
    assert set(FAILURE_REASONS) < set(code_exec.ROW_REASONS)
