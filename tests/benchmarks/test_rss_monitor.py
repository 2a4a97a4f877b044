"""bench_step.RssMonitor: tree peaks by RSS and PSS, the steady part after the warm-up, the top processes."""

import os
import subprocess
import sys
import time

import psutil

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from bench_step import RssMonitor  # noqa: E402

HOLD = ("import sys, time; x = bytearray(int(sys.argv[1])); x[::4096] = b'1' * len(x[::4096]); "
        "print(1, flush=True); time.sleep(60)")  # holds touched memory until killed


def _child(nbytes: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(nbytes)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"  # its memory is touched
    return proc


def test_peaks_steady_part_and_top_processes():
    me = psutil.Process()
    monitor = RssMonitor()
    monitor.sample([me])
    alone = monitor.peak_total
    assert monitor.figures()["steady_rss_gib"] is None  # not steady yet: no figure, not 0
    child = _child(300 * 2**20)
    try:
        monitor.sample([me, psutil.Process(child.pid)])
        assert monitor.peak_total >= alone + 300 * 2**20
        assert monitor.peak_pss <= monitor.peak_total  # shared library pages are divided, not counted twice
        top = monitor.figures()["peak_rss_top"]
        assert {row["pid"] for row in top} == {me.pid, child.pid}
        assert next(r for r in top if r["pid"] == child.pid)["rss_gib"] >= 300 / 1024
        assert "bytearray" in next(r for r in top if r["pid"] == child.pid)["command"]
    finally:
        child.kill()
        child.wait()
    monitor.mark_steady()
    monitor.sample([me])  # the child (a compile worker, say) is gone after the warm-up
    figures = monitor.figures()
    assert figures["steady_rss_gib"] * 2**30 < monitor.peak_total - 250 * 2**20
    assert 0 < figures["steady_pss_gib"] <= figures["steady_rss_gib"]
    assert figures["peak_rss_one_process_gib"] >= 300 / 1024


def test_the_thread_polls_this_process_tree_and_reads_pss_every_fifth_poll(monkeypatch):
    reads = []  # pids whose PSS was read: the tree may hold children of earlier tests (compile workers)
    real = psutil.Process.memory_full_info
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda self: reads.append(self.pid) or real(self))
    monitor = RssMonitor(interval_s=0.01)
    monitor.start()
    deadline = time.time() + 10
    while monitor._polls < 10 and time.time() < deadline:
        time.sleep(0.01)
    assert monitor.peak_total > 0 and monitor.peak_pss > 0 and monitor.top  # by the thread, before stop()
    monitor.stop()  # the thread has ended: the counts below no longer move
    assert not monitor.is_alive()
    polls, pss_reads = monitor._polls, reads.count(os.getpid())
    assert polls >= 10
    assert pss_reads == (polls + RssMonitor.PSS_EVERY - 1) // RssMonitor.PSS_EVERY + 1  # + stop()'s last poll


def test_a_poll_without_pss_keeps_rss_only():
    monitor = RssMonitor()
    monitor.sample([psutil.Process()], pss=False)
    figures = monitor.figures()
    assert figures["peak_rss_gib"] > 0 and figures["peak_pss_gib"] is None
    assert figures["peak_rss_top"][0]["pss_gib"] is None


class _Guarded:
    """A process whose smaps the system refuses (containers without ptrace rights)."""

    pid = 4242

    def memory_full_info(self):
        raise psutil.AccessDenied(self.pid)

    def memory_info(self):
        return _Rss()

    def cmdline(self):
        return ["guarded"]


class _Rss:
    rss = 3 * 2**30


def test_a_process_whose_pss_cannot_be_read_counts_its_rss():
    monitor = RssMonitor()
    monitor.sample([_Guarded()])
    figures = monitor.figures()
    assert figures["peak_rss_gib"] == figures["peak_pss_gib"] == 3.0
    assert figures["peak_rss_top"] == [{"pid": 4242, "command": "guarded", "rss_gib": 3.0, "pss_gib": 3.0}]
