"""FSDP2 on 2 gloo ranks: log-probs and PPO updates equal the single-process results."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm
from hybrid_rl.workers.config import FSDPConfig, MixedPrecisionConfig, ModelConfig, derive_batch_sizes
from hybrid_rl.workers.fsdp_utils import full_state_dict
from hybrid_rl.workers.model_loader import load_causal_lm
from tests.workers.dist_helpers import run_ranks
from tests.workers.helpers import actor_config, hf_response_log_probs, ppo_batch

FP32 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="float32"))
BF16 = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16"))  # bf16 numerics on every CPU kind
COMMON = dict(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.01, ppo_micro_batch_size_per_gpu=2)


def _prepared_batch(model):
    data = ppo_batch(model)
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    return data


def _update_on_rank(model_dir, data, rank, world, fsdp_config, remove_padding=False, fused_head=False, **cfg):
    """Shard of ``data`` for ``rank``, updated on a fresh FSDP model; returns (full params, metrics)."""
    model = build_causal_lm(ModelConfig(path=model_dir), model_dir, fsdp_config, torch.device("cpu"),
                            trainable=True)
    config = actor_config(**{**COMMON, **cfg})
    sizes = derive_batch_sizes(key="actor", ppo_mini_batch_size=config.ppo_mini_batch_size, n=1,
                               dp_size=world, ppo_micro_batch_size_per_gpu=2,
                               log_prob_micro_batch_size_per_gpu=3)
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=1e-2),
                                 ppo_mini_batch_size_per_gpu=sizes.ppo_mini_batch_size_per_gpu,
                                 use_remove_padding=remove_padding, fused_head=fused_head)
    shard = data.chunk(world)[rank]
    log_probs, _ = actor.compute_log_prob(shard)
    metrics = actor.update_policy(shard)
    return log_probs, full_state_dict(model), metrics


def _two_rank_job(rank, world, model_dir, data, grouped, out_path):
    results = {}
    for name, fsdp_config, cfg in [("fixed", FP32, {}),
                                   ("dynamic", FP32, dict(use_dynamic_bsz=True,
                                                          ppo_max_token_len_per_gpu=16)),
                                   ("bf16", BF16, {}),
                                   ("fused", FP32, dict(remove_padding=True, fused_head=True))]:
        results[name] = _update_on_rank(model_dir, data, rank, world, fsdp_config, **cfg)
    # prefix grouper: 4 prompts x 2 responses, 2 groups per rank; a budget of one group per
    # micro-batch on one rank and two on the other makes the ranks agree on the pass count
    budget = 16 if rank == 0 else 40
    results["grouped"] = _update_on_rank(model_dir, grouped, rank, world, FP32, remove_padding=True,
                                         use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget)
    # a frozen reference under bf16 mixed precision is stored in bf16 (no fp32 master weights)
    ref = build_causal_lm(ModelConfig(path=model_dir), model_dir, BF16, torch.device("cpu"), trainable=False)
    ref_dtypes = sorted({str(p.dtype) for p in ref.parameters()})
    ref_log_probs, _ = DataParallelPPOActor(actor_config(**COMMON), ref).compute_log_prob(data.chunk(world)[rank])
    results["ref_bf16"] = (ref_log_probs, None, {"dtypes": ref_dtypes, "fsdp": isinstance(ref, FSDPModule)})
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, {k: (v[0], v[2]) for k, v in results.items()})
    if rank == 0:
        torch.save({"log_probs": {k: torch.cat([g[k][0] for g in gathered]) for k in results},
                    "metrics": {k: gathered[0][k][1] for k in results},
                    "params": {k: v[1] for k, v in results.items() if v[1] is not None}}, out_path)


@pytest.fixture(scope="module")
def two_rank_results(tiny_model_dir, tmp_path_factory):
    base = load_causal_lm(tiny_model_dir)
    data = _prepared_batch(base)
    grouped = _grouped_batch()
    out = tmp_path_factory.mktemp("dist") / "results.pt"
    run_ranks(_two_rank_job, 2, tiny_model_dir, data, grouped, str(out))
    return base, data, torch.load(out, weights_only=True)


def _grouped_batch():
    from tests.workers.test_prefix_grouper import grouped_batch

    data = grouped_batch(prompts=4, n=2)
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    return data


def _single_process_update(base, data):
    model = copy.deepcopy(base)
    actor = DataParallelPPOActor(actor_config(**COMMON), model,
                                 torch.optim.SGD(model.parameters(), lr=1e-2))
    metrics = actor.update_policy(data)
    return model.state_dict(), metrics


def test_two_rank_log_probs_match_hf(two_rank_results):
    base, data, res = two_rank_results
    expected = hf_response_log_probs(base, data, 0.7)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(res["log_probs"]["fixed"][mask], expected[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["fixed", "dynamic", "fused"])
def test_two_ranks_half_batch_equal_one_rank_full_batch(two_rank_results, variant):
    base, data, res = two_rank_results
    params, metrics = _single_process_update(base, data)
    moved = max((params[k] - base.state_dict()[k]).abs().max().item() for k in params)
    assert moved > 1e-3
    for name, value in params.items():
        torch.testing.assert_close(res["params"][variant][name], value, atol=1e-5, rtol=0, msg=name)
    # loss metrics are all-reduced: the same full-mini-batch values as on one rank
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert res["metrics"][variant][key][0] == pytest.approx(metrics[key][0], rel=1e-4, abs=1e-5), key


def test_two_ranks_prefix_grouped_equal_one_rank_padded(two_rank_results):
    base, _, res = two_rank_results
    data = _grouped_batch()
    padded_log_probs = hf_response_log_probs(base, data, 0.7)
    params, metrics = _single_process_update(base, data)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(res["log_probs"]["grouped"][mask], padded_log_probs[mask], atol=1e-5, rtol=1e-5)
    for name, value in params.items():
        torch.testing.assert_close(res["params"]["grouped"][name], value, atol=1e-5, rtol=0, msg=name)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert res["metrics"]["grouped"][key][0] == pytest.approx(metrics[key][0], rel=1e-4, abs=1e-5), key


def test_two_ranks_bf16_mixed_precision_is_close(two_rank_results):
    base, data, res = two_rank_results
    params, _ = _single_process_update(base, data)
    mask = data.batch["response_mask"].bool()
    expected = hf_response_log_probs(base, data, 0.7)
    # the random tiny model has log-probs around -10: bf16 keeps them within ~1%
    rel = (res["log_probs"]["bf16"][mask] - expected[mask]).abs() / expected[mask].abs()
    assert rel.mean() < 0.01 and rel.max() < 0.05
    worst = 0.0
    for name, value in params.items():  # fp32 master weights, bf16 compute
        assert res["params"]["bf16"][name].dtype == torch.float32
        worst = max(worst, (res["params"]["bf16"][name] - value).abs().max().item())
    assert worst < 0.05, worst


def test_frozen_reference_is_stored_in_its_compute_dtype(two_rank_results):
    _, _, res = two_rank_results
    assert res["metrics"]["ref_bf16"] == {"dtypes": ["torch.bfloat16"], "fsdp": True}  # sharded over 2 ranks
    # same log-probs as fp32 master weights cast to bf16 at every all-gather (the "bf16" actor)
    torch.testing.assert_close(res["log_probs"]["ref_bf16"], res["log_probs"]["bf16"], atol=0, rtol=0)


def _one_rank_ref_job(rank, world, model_dir, data, out_path):
    ref = build_causal_lm(ModelConfig(path=model_dir), model_dir, BF16, torch.device("cpu"), trainable=False)
    actor = build_causal_lm(ModelConfig(path=model_dir), model_dir, BF16, torch.device("cpu"), trainable=True)
    config = actor_config(**COMMON)
    torch.save({"ref_fsdp": isinstance(ref, FSDPModule), "actor_fsdp": isinstance(actor, FSDPModule),
                "ref_dtypes": sorted({str(p.dtype) for p in ref.parameters()}),
                "ref": DataParallelPPOActor(config, ref).compute_log_prob(data)[0],
                "actor": DataParallelPPOActor(config, actor).compute_log_prob(data)[0]}, out_path)


def test_one_rank_frozen_reference_is_not_wrapped_and_computes_the_same(tiny_model_dir, tmp_path):
    # nothing to shard on one rank: the frozen ref is a plain bf16 module (no FSDP2 all-gather copies)
    data = _prepared_batch(load_causal_lm(tiny_model_dir))
    out = tmp_path / "ref.pt"
    run_ranks(_one_rank_ref_job, 1, tiny_model_dir, data, str(out))
    res = torch.load(out, weights_only=True)
    assert (res["ref_fsdp"], res["actor_fsdp"], res["ref_dtypes"]) == (False, True, ["torch.bfloat16"])
    # bitwise the log-probs of the FSDP2 actor that casts its fp32 weights to bf16 at every forward
    torch.testing.assert_close(res["ref"], res["actor"], atol=0, rtol=0)
