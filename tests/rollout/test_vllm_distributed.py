"""vLLM engines inside an initialised 2-rank gloo group (the FSDP worker situation), one per rank.

Each rank builds its own TP=1 engine after ``init_process_group``; the trainer's group must keep
working before, between and after engine calls, and survive the engine's shutdown.
"""

import dataclasses
import json
import multiprocessing as mp
import os
import socket

import pytest

from hybrid_rl.workers.rollout import vllm_unavailable_reason

_VLLM_SKIP = vllm_unavailable_reason("cpu")
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(rows, **meta):
    import torch

    from hybrid_rl.protocol import DataProto

    ids = torch.tensor(rows)
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1]).expand_as(ids).clone()
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               meta_info={"eos_token_id": 2, **meta})


def _rank_main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    """One trainer rank: gloo group first, then the engine; results to out_dir/rank{r}.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    from hybrid_rl.workers.model_loader import load_tokenizer
    from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

    dist.init_process_group("gloo", rank=rank, world_size=2)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=6, prompt_length=8,
                        cpu_kvcache_space_gib=1, max_num_seqs=8)
    tokenizer = load_tokenizer(model_dir)
    engine = build_rollout(cfg, model_dir, tokenizer, "cpu")
    reference = build_rollout(dataclasses.replace(cfg, name="hf"), model_dir, tokenizer, "cpu")
    own = [[5 + rank, 6, 7]]  # each rank its own prompt
    result = {"name": engine.name, "allreduce_before": total.item()}
    result["greedy"] = engine.generate_sequences(_prompts(own, do_sample=False)).batch["responses"].tolist()
    result["greedy_hf"] = reference.generate_sequences(_prompts(own, do_sample=False)).batch["responses"].tolist()
    # Same prompt on both ranks: distinct DP ranks must draw distinct samples.
    result["sampled_same_prompt"] = engine.generate_sequences(_prompts([[5, 6, 7]] * 2)).batch["responses"].tolist()
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    gen = torch.Generator().manual_seed(rank)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in weights.items()}
    engine.update_weights(iter(perturbed.items()))
    reference.update_weights(iter(perturbed.items()))
    result["greedy_after_sync"] = engine.generate_sequences(_prompts(own, do_sample=False)).batch["responses"].tolist()
    result["greedy_hf_after_sync"] = reference.generate_sequences(
        _prompts(own, do_sample=False)).batch["responses"].tolist()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    result["allreduce_between"] = total.item()
    from hybrid_rl.workers.rollout.vllm_rollout import gather_rows  # what TP>1 groups use on GPU

    rows, own_slice = gather_rows([[rank] * (rank + 1)] * (rank + 1))
    result["gathered"] = [rows, [own_slice.start, own_slice.stop]]
    engine.shutdown()
    total = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(total)  # the trainer's group survived the engine's shutdown
    result["allreduce_after_shutdown"] = total.item()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def test_engine_per_rank_in_initialised_gloo_group(tiny_model_dir, tmp_path):
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, tiny_model_dir, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed (see its stderr above)"
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for res in results:
        assert res["name"] == "vllm"
        assert (res["allreduce_before"], res["allreduce_between"], res["allreduce_after_shutdown"]) == (3, 3, 30)
        assert res["greedy"] == res["greedy_hf"]  # each rank's engine runs its own prompt
        assert res["greedy_after_sync"] == res["greedy_hf_after_sync"]
        assert res["greedy_after_sync"] != res["greedy"]
    assert results[0]["greedy"] != results[1]["greedy"]
    all_rows = [[0], [1, 1], [1, 1]]  # rank 0 has one row, rank 1 two
    assert results[0]["gathered"] == [all_rows, [0, 1]] and results[1]["gathered"] == [all_rows, [1, 3]]
    assert results[0]["sampled_same_prompt"] != results[1]["sampled_same_prompt"]
