"""What the studio's trajectory viewer costs to answer, on a dump step larger than the default run's.

Writes one training step with the trainer's dump writer (``--groups`` prompt groups of ``--n``
responses of up to ``--response-length`` tokens, random ids of the embedded model's vocabulary, the
per-token log-probs, entropies and advantages a dump holds) and times the viewer's answers as the page
asks for them: the step's group list (``/api/trajectories/step``) and one group's token view
(``/api/trajectories/group``, each token decoded into its piece; the tokenizer is loaded once, before);
the first group list parses the files, the next ones reuse them.
Also the bytes of the step's files and of the page's own script and style::

    python benchmarks/bench_trajectories.py [--groups 16] [--n 8] [--response-length 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.studio import trajectories
from hybrid_rl.studio.workspace import Workspace
from hybrid_rl.trainer.core.dumps import DumpPart, StepDumps
from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, ensure_embedded_model, load_tokenizer


def step_batch(groups: int, n: int, response_length: int, seed: int = 0) -> DataProto:
    """``groups * n`` rows: 100-token prompts, responses of random lengths, a dump's per-token keys."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * n
    lengths = torch.randint(response_length // 4, response_length + 1, (rows,), generator=g)
    mask = (torch.arange(response_length)[None] < lengths[:, None]).long()  # [B, R]
    prompts = torch.randint(100, 20000, (rows, 100), generator=g)
    tensors = {"prompts": prompts, "responses": torch.randint(100, 20000, (rows, response_length), generator=g) * mask,
               "response_mask": mask, "attention_mask": torch.cat([torch.ones_like(prompts), mask], 1)}
    for key in ("rollout_log_probs", "old_log_probs"):
        tensors[key] = -torch.rand(rows, response_length, generator=g) * mask
    tensors["entropys"] = torch.rand(rows, response_length, generator=g) * mask
    tensors["advantages"] = torch.randn(rows, 1, generator=g) * mask
    uids = np.array([f"u{i // n}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(tensors, non_tensors={"uid": uids})


def median_seconds(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = load_tokenizer(str(ensure_embedded_model()))
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        batch = step_batch(args.groups, args.n, args.response_length)
        scores = [float(i % 2) for i in range(len(batch))]
        verl, side = StepDumps(str(run / "dumps"), tokenizer).write(1, [DumpPart(batch, scores, {})])
        (run / "dumps" / "meta.json").write_text(json.dumps({"config": {"actor_rollout_ref": {"model": {
            "path": EMBEDDED_MODEL_ID}}}}))
        workspace, tokenizers = Workspace([root], base=root), trajectories.Tokenizers(Workspace([root], base=root))
        tokenizers.decoder(EMBEDDED_MODEL_ID)  # loaded once per run, before the first group
        cold = median_seconds(lambda: trajectories.step_json("run", "dumps", "1", workspace), 1)  # files parsed
        step = median_seconds(lambda: trajectories.step_json("run", "dumps", "1", workspace), args.repeats)
        group = median_seconds(lambda: trajectories.group_json("run", "dumps", "1", "u0", workspace, tokenizers),
                               args.repeats)
        answer = json.dumps(trajectories.group_json("run", "dumps", "1", "u0", workspace, tokenizers))
        static = Path(trajectories.__file__).with_name("static")
        page = sum(os.path.getsize(static / name) for name in ("trajectories.js", "trajectories.css"))
        print(f"step of {len(batch)} rows ({args.groups} groups x {args.n}, responses up to {args.response_length} "
              f"tokens; files {(os.path.getsize(verl) + os.path.getsize(side)) / 2**20:.1f} MiB): group list "
              f"{cold * 1000:.0f} ms first, {step * 1000:.0f} ms after (parsed files kept); one group's token view "
              f"{group * 1000:.0f} ms ({len(answer) / 2**10:.0f} KiB of JSON); "
              f"the viewer's script and style {page / 2**10:.1f} KiB")


if __name__ == "__main__":
    main()
