"""FileMappedWeights: a frozen module's weights in a private file mapping, dropped between uses."""

import os

import psutil
import pytest
import torch
from torch import nn

from hybrid_rl.utils.mapped_weights import FileMappedWeights, ram_file_system


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 512), nn.Linear(512, 512), nn.Linear(512, 64, bias=False))
    model[2].weight = model[0].weight.__class__(torch.randn(64, 512))  # a separate head...
    model[0].weight = model[2].weight  # ...tied to the embedding, as SmolLM2's is
    return model.to(torch.bfloat16)


def test_the_mapped_module_computes_the_same_and_ties_stay_tied(tmp_path):
    model = _model()
    x = torch.tensor([[1, 5, 9]])
    expected = model(x)
    mapped = FileMappedWeights(model, str(tmp_path))
    assert model[0].weight is model[2].weight  # one copy in the file
    assert mapped.nbytes >= 64 * 512 * 2 + 512 * 512 * 2 + 512 * 2
    assert torch.equal(model(x), expected)
    mapped.release()
    assert torch.equal(model(x), expected)  # read back from the page cache
    assert os.listdir(tmp_path) == []  # unlinked once mapped


def test_release_gives_the_pages_back_to_the_system(tmp_path):
    model = nn.Linear(4096, 4096, bias=False)  # 64 MiB in fp32
    mapped = FileMappedWeights(model, str(tmp_path))
    process = psutil.Process()
    model.weight.sum()  # fault every page in
    resident = process.memory_info().rss
    mapped.release()
    assert resident - process.memory_info().rss > 0.9 * mapped.nbytes
    assert float(model.weight.sum()) == pytest.approx(float(model.weight.double().sum()), rel=1e-4)


def test_a_write_stays_private_and_release_restores_the_file(tmp_path):
    model = nn.Linear(8, 8)
    before = model.weight.detach().clone()
    mapped = FileMappedWeights(model, str(tmp_path))
    with torch.no_grad():
        model.weight.add_(1.0)  # copy-on-write: the file keeps the original
    mapped.release()
    assert torch.equal(model.weight, before)


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
30 22 0:25 / /tmp rw shared:7 - tmpfs tmpfs rw,size=4g
31 30 8:2 / /tmp/disk rw shared:8 - ext4 /dev/sda2 rw
"""


@pytest.mark.parametrize("directory,expected", [
    ("/home/u", None), ("/dev/shm", "tmpfs"), ("/tmp", "tmpfs"), ("/tmp/x", "tmpfs"),
    ("/tmp/disk/y", None),  # the longest mount point decides
    ("/tmpfoo", None),  # a prefix of the name is not a parent
])
def test_ram_file_systems_are_found_by_the_longest_mount_point(directory, expected):
    assert ram_file_system(directory, MOUNTINFO) == expected
