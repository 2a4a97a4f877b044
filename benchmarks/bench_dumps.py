"""Cost of trainer.rollout_data_dir / validation_data_dir on the default run's batches.

Builds the default run's training batch (data.train_batch_size x rollout.n rows of its real arithmetic
prompts, max_response_length responses, rollout log-probs, advantages, scores) and its validation
batch (every held-out prompt, one response), then times :class:`~hybrid_rl.trainer.core.dumps.StepDumps`
writing them (plain and gzip). The run's dump cost is ``steps x train dump + validations x val
dump``, to compare with the run's wall time (docs/observability.md). ``trainer.dump_replay_batch`` adds
the step's whole batch (``{step}.batch.pt``, the padded tensors the update consumed, for replay):
timed and sized on the same training batch, with the keys the default run's batch has when it is
dumped::

    python benchmarks/bench_dumps.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.core import batch_file, inputs
from hybrid_rl.trainer.core.dumps import DumpPart, StepDumps, training_part
from hybrid_rl.trainer.core.validation import dataset_batches
from hybrid_rl.trainer.ppo import inputs as ppo_inputs


def rollout_batch(prompts: DataProto, n: int, response_length: int, seed: int = 0) -> DataProto:
    """``prompts`` repeated ``n`` times with random responses of random lengths and the keys the
    default run's batch has after its update."""
    g = torch.Generator().manual_seed(seed)
    batch = prompts.repeat(n, interleave=True)
    rows = len(batch)
    lengths = torch.randint(2, response_length + 1, (rows,), generator=g)
    mask = (torch.arange(response_length)[None] < lengths[:, None]).long()  # [B, R]
    responses = torch.randint(100, 20000, (rows, response_length), generator=g) * mask
    scores = torch.zeros(rows, response_length)
    scores[torch.arange(rows), lengths - 1] = torch.randint(0, 2, (rows,), generator=g).float()
    batch.batch["prompts"] = batch.batch["input_ids"]
    batch.batch["responses"] = responses
    batch.batch["response_mask"] = mask
    batch.batch["attention_mask"] = torch.cat([batch.batch["attention_mask"], mask], 1)
    batch.batch["rollout_log_probs"] = -torch.rand(rows, response_length, generator=g) * mask
    batch.batch["advantages"] = torch.randn(rows, 1, generator=g) * mask
    batch.batch["token_level_scores"] = scores
    batch.non_tensor_batch["uid"] = np.array([f"1_{i // n}" for i in range(rows)], dtype=object)
    return batch


def replay_batch(batch: DataProto) -> DataProto:
    """``batch`` as the default run's step holds it at the dump: the whole sequence's ``input_ids`` and
    ``position_ids`` [B, P + R], the rewards and returns of GRPO's advantage step."""
    batch = DataProto.from_dict(dict(batch.batch.items()), dict(batch.non_tensor_batch), dict(batch.meta_info))
    tensors = batch.batch
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], 1)  # [B, P + R]
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # [B, P + R]
    tensors["token_level_rewards"] = tensors["token_level_scores"]
    tensors["returns"] = tensors["advantages"]
    return batch


def time_batch_file(batch: DataProto, folder: str, repeats: int) -> tuple[float, int]:
    """Median seconds of one ``{step}.batch.pt`` write, and its bytes."""
    path, seconds = batch_file.batch_path(folder, 0), []
    for _ in range(repeats):
        start = time.perf_counter()
        batch_file.save_batch(path, batch)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), os.path.getsize(path)


def time_write(dumps: StepDumps, parts: list[DumpPart], repeats: int) -> float:
    """Median seconds of one ``dumps.write``."""
    seconds = []
    for step in range(repeats):
        start = time.perf_counter()
        dumps.write(step, parts)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = PPOConfig()
    tokenizer = ppo_inputs.build_tokenizer(cfg)
    train_files, val_files = inputs.resolve_data_files(cfg)
    train = ppo_inputs.build_dataset(train_files, tokenizer, cfg)
    val = ppo_inputs.build_dataset(val_files, tokenizer, cfg)
    n, r = cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length
    step = training_part(rollout_batch(next(iter(dataset_batches(train, cfg.data.train_batch_size))), n, r))
    held_out = rollout_batch(next(iter(dataset_batches(val))), 1, r, seed=1)
    val_part = DumpPart(held_out, held_out.batch["token_level_scores"].sum(-1).tolist(), {})
    with tempfile.TemporaryDirectory() as folder:
        for compress in (False, True):
            dumps = StepDumps(folder, tokenizer, compress=compress)
            t_train, t_val = time_write(dumps, [step], args.repeats), time_write(dumps, [val_part], args.repeats)
            print(f"gzip={compress}: train step ({len(step.batch)} rows) {t_train * 1000:.1f} ms, "
                  f"validation ({len(held_out)} rows) {t_val * 1000:.1f} ms")
        t_batch, size = time_batch_file(replay_batch(step.batch), folder, args.repeats)
        print(f"replay batch ({len(step.batch)} rows, trainer.dump_replay_batch): {t_batch * 1000:.1f} ms, "
              f"{size / 2**20:.2f} MiB per step")


if __name__ == "__main__":
    main()
