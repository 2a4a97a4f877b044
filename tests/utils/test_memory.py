"""Memory accounting: exact storage bytes per owner, and the per-phase peak RSS."""

import pytest
import torch

from hybrid_rl.utils.memory import (GIB, current_rss, grad_bytes, module_bytes, optimizer_bytes, peak_rss,
                                    phase_peak, reset_peak_rss, tensor_bytes)


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(10, 4)  # 160 bytes
    view = a[2:5]  # same storage
    b = torch.zeros(3, dtype=torch.bfloat16)  # 6 bytes
    assert tensor_bytes([a, view, None, b]) == 160 + 6
    seen: set = set()
    assert tensor_bytes([a], seen) == 160
    assert tensor_bytes([view, b], seen) == 6  # a's storage already counted by the first owner
    assert tensor_bytes([torch.empty(0)]) == 0
    assert tensor_bytes([a], device="cuda") == 0  # only storages on the named device


def test_module_grad_and_optimizer_bytes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=False))
    model[1].weight = model[0].weight  # tied, as SmolLM2's embedding and LM head
    assert module_bytes(model) == 7 * 4 * 4
    assert grad_bytes(model) == 0
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2])).sum().backward()
    assert grad_bytes(model) == 7 * 4 * 4
    opt.step()
    # exp_avg + exp_avg_sq (fp32, the parameter's shape) + a scalar fp32 step tensor
    assert optimizer_bytes(opt) == 2 * 7 * 4 * 4 + 4


_PEAK_PROBE = """
import mmap
from hybrid_rl.utils.memory import GIB, current_rss, phase_peak, reset_peak_rss
if not reset_peak_rss():
    print("unsupported")
    raise SystemExit
metrics = {}
before = current_rss()
with phase_peak(metrics, "big"):
    block = mmap.mmap(-1, 64 * 2**20)  # fresh pages from the OS, whatever the allocator holds
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1  # touched: resident
    block.close()  # unmapped: gone from RSS at once
with phase_peak(metrics, "small"):
    pass
print(before, int(metrics["big"] * GIB), int(metrics["small"] * GIB))
"""


def test_phase_peak_sees_a_transient_allocation_and_resets():
    """In a fresh process (the suite's own may hold freed pages in jemalloc or glibc arenas, which a
    new allocation reuses without raising RSS): 64 MiB touched inside the phase shows in its peak,
    and the next phase's peak starts again from the current RSS."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE], capture_output=True, text=True, check=True).stdout
    if out.strip() == "unsupported":
        pytest.skip("this OS does not let a process reset its RSS high-water mark")
    before, big, small = (int(v) for v in out.split())
    assert big >= before + 60 * 2**20
    assert small < big - 32 * 2**20
    assert peak_rss() >= current_rss() - 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_phase_peak_reports_the_phase_gpu_memory():
    torch.zeros(1, device="cuda")  # CUDA initialised, as in a worker
    metrics = {}
    with phase_peak(metrics, "perf/peak_rss_gib/update_actor"):
        block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # 0.25 GiB
        del block
    assert metrics["perf/max_memory_allocated_gib/update_actor"] >= 0.25
    assert metrics["perf/max_memory_reserved_gib/update_actor"] >= 0.25


_RELEASE_PROBE = """
import torch
from hybrid_rl.utils.memory import current_rss, release_free_memory
x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
del x
held = current_rss()
released = release_free_memory()
print(released, held - current_rss())
"""


def test_release_free_memory_purges_jemalloc_and_leaves_glibc_alone():
    """Under the trainer's jemalloc settings (no decay) freed pages stay until the phase-end purge,
    which returns them; under glibc the call does nothing."""
    import os
    import subprocess
    import sys

    from hybrid_rl.utils.cpu_env import JEMALLOC_CONF, bundled_jemalloc

    glibc = subprocess.run([sys.executable, "-c", _RELEASE_PROBE], capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert glibc.stdout.split()[0] == "False"
    path = bundled_jemalloc()
    if path is None:
        pytest.skip("Ray's bundled jemalloc is not installed here")
    jemalloc = subprocess.run([sys.executable, "-c", _RELEASE_PROBE], capture_output=True, text=True, check=True,
                              env=dict(os.environ, LD_PRELOAD=path, MALLOC_CONF=JEMALLOC_CONF))
    released, freed_bytes = jemalloc.stdout.split()
    assert released == "True" and int(freed_bytes) > 48 * 2**20  # most of the 64 MiB went back
