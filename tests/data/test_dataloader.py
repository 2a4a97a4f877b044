"""ResumableDataLoader: exact epoch orders, and a restored state replays the same next batches."""

import pytest
import torch
from data_helpers import make_row, write_jsonl

from hybrid_rl.data import RLHFDataset, build_dataloader
from hybrid_rl.utils.testing import build_byte_tokenizer


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def ids(batch):
    return batch.tolist()


def take(loader, num_batches):
    """The next ``num_batches`` batches, crossing epoch boundaries like a trainer loop would."""
    out = []
    while len(out) < num_batches:
        for batch in loader:
            out.append(ids(batch))
            if len(out) == num_batches:
                break
    return out


def test_epoch_orders_are_seeded_permutations():
    loader = build_dataloader(Rows(10), batch_size=3, shuffle=True, seed=7)
    assert len(loader) == 3  # drop_last
    epoch0, epoch1 = take(loader, 3), take(loader, 3)
    gen = torch.Generator().manual_seed(7)
    assert [x for b in epoch0 for x in b] == torch.randperm(10, generator=gen).tolist()[:9]
    gen = torch.Generator().manual_seed(8)  # epoch 1 uses seed + 1
    assert [x for b in epoch1 for x in b] == torch.randperm(10, generator=gen).tolist()[:9]
    assert loader.state_dict()["epoch"] == 2


def test_no_shuffle_keep_last():
    loader = build_dataloader(Rows(7), batch_size=3, shuffle=False, drop_last=False)
    assert len(loader) == 3
    assert [ids(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("stop_after", [0, 2, 4, 5, 9])
def test_restored_state_gives_identical_next_batches(stop_after):
    reference = build_dataloader(Rows(11), batch_size=2, shuffle=True, seed=3)  # 5 batches per epoch
    expected = take(reference, 14)

    first = build_dataloader(Rows(11), batch_size=2, shuffle=True, seed=3)
    assert take(first, stop_after) == expected[:stop_after]
    state = first.state_dict()
    # A fresh loader built with a different seed: the state must carry the seed too.
    resumed = build_dataloader(Rows(11), batch_size=2, shuffle=True, seed=999)
    resumed.load_state_dict(state)
    assert take(resumed, 14 - stop_after) == expected[stop_after:]


def test_break_then_iterate_again_continues():
    loader = build_dataloader(Rows(8), batch_size=2, shuffle=True, seed=0)
    expected = take(build_dataloader(Rows(8), batch_size=2, shuffle=True, seed=0), 4)
    got = []
    for batch in loader:
        got.append(ids(batch))
        break
    got += [ids(b) for b in loader]
    assert got == expected
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch_in_epoch"] == 0


def test_state_mismatch_and_too_small_dataset():
    state = build_dataloader(Rows(8), batch_size=2).state_dict()
    with pytest.raises(ValueError, match="num_samples=8 but this loader has num_samples=9"):
        build_dataloader(Rows(9), batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=2 but this loader has batch_size=4"):
        build_dataloader(Rows(8), batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than batch_size=5"):
        build_dataloader(Rows(4), batch_size=5)
    with pytest.raises(ValueError, match="dataset is empty"):
        build_dataloader(Rows(0), batch_size=1, drop_last=False)


def test_rlhf_dataset_loader_uses_its_collate(tmp_path):
    path = write_jsonl([make_row("a" * (i + 1), truth=str(i)) for i in range(6)], tmp_path / "a.jsonl")
    ds = RLHFDataset(path, build_byte_tokenizer())
    loader = build_dataloader(ds, batch_size=4, shuffle=False, seed=0)
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, int(ds.prompt_lengths()[:4].max()))
    assert [rm["ground_truth"] for rm in batch["reward_model"]] == ["0", "1", "2", "3"]
    assert batch["attention_mask"].sum(-1).tolist() == ds.prompt_lengths()[:4].tolist()
