"""benchmarks/bench_gpu.py (issue #20): the FLOP/MFU arithmetic on hand-computed figures, the workload
and the ~1B shape it names, TRL-side helpers that need no TRL, and a CPU smoke run end to end."""

import json
import math
import os
import subprocess
import sys
import time
from argparse import Namespace

import pytest
import torch

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, os.path.join(REPO, "scripts"))
from bench_gpu import GpuMemoryMonitor, workload  # noqa: E402
from bench_gpu_trl import arithmetic_reward, dataset_rows, phases, time_methods  # noqa: E402
from bench_step import median_figures, step_figures  # noqa: E402
from make_random_model import PRESETS, llama_config  # noqa: E402


def test_step_figures_count_flops_and_mfu_by_hand():
    # 20 rows of 10 response tokens; 1000 tokens per pass, half of them computed in the update
    m = {"perf/total_num_tokens": 1000, "response_length/mean": 10.0, "timing_s/step": 4.0, "timing_s/gen": 1.0,
         "timing_s/ref": 0.5, "timing_s/update_actor": 2.0, "perf/computed_token_frac/update_actor": 0.5}
    f = step_figures(m, (10**6, 10**5), rows=20, peaks={"float32": 1e10, "bfloat16": None}, epochs=2,
                     dtype="float32")
    ref_flops = 2 * 10**6 * 1000 + 2 * 10**5 * 200  # forward: body on every token, head on response tokens
    update_flops = 3 * (2 * 10**6 * 500 + 2 * 10**5 * 200) * 2  # x3 forward + backward, x2 epochs
    assert f["ref_gflops"] == pytest.approx(ref_flops / 0.5 / 1e9)
    assert f["ref_mfu_float32"] == pytest.approx(ref_flops / 0.5 / 1e10)
    assert f["update_actor_gflops"] == pytest.approx(update_flops / 2.0 / 1e9)
    assert f["update_actor_mfu"] == pytest.approx(update_flops / 2.0 / 1e10)
    assert math.isnan(f["update_actor_mfu_bfloat16"])  # no measurable peak: no MFU rather than a wrong one
    assert f["gen_tok_s"] == pytest.approx(200.0) and f["overhead_s"] == pytest.approx(0.5)
    assert "old_log_prob_gflops" not in f  # a skipped pass (on-policy step) gets no FLOP/s
    steps = [{"step_s": 9.0}, {"step_s": 2.0}, {"step_s": 4.0}]
    assert median_figures({"steps": steps, "warmup": 1})["step_s"] == 3.0  # the warm-up step left out


def test_llama_1b_shape_has_about_a_billion_parameters():
    shape = PRESETS["llama-1b"]
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(llama_config(49152, **shape))
    count = sum(p.numel() for p in model.parameters())
    h, kv = shape["hidden"], shape["kv_heads"] * shape["hidden"] // shape["heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * shape["mlp"] + 2 * h  # q,o + k,v + MLP + 2 norms
    assert count == 49152 * h + shape["layers"] * per_layer + h  # tied embedding + final norm
    assert 1.0e9 < count < 1.1e9


def test_llama_1b_folder_is_written_once_then_reused(tmp_path, monkeypatch):
    import bench_gpu
    import make_random_model

    built = []

    def fake_build(out, **kwargs):
        built.append(kwargs)
        (out / "config.json").write_text("{}")
        return 1

    monkeypatch.setattr(make_random_model, "build", fake_build)
    folder = tmp_path / "cache" / "llama-1b"
    assert bench_gpu.llama_1b_dir(str(folder)) == bench_gpu.llama_1b_dir(str(folder)) == str(folder)
    assert built == [{**PRESETS["llama-1b"], "dtype": "bfloat16", "seed": 0}]
    assert sorted(os.listdir(folder.parent)) == ["llama-1b"]  # no temporary folder left behind


def _args(**kw):
    base = dict(device="cuda", model="smollm2", model_dir=None, max_token_len=None, overrides=[])
    return Namespace(**{**base, **kw})


def test_gpu_workload_is_the_issues_shape_and_user_overrides_win():
    from hybrid_rl.trainer import get_config

    cfg = get_config(workload(_args(overrides=["actor_rollout_ref.actor.kl_loss_coef=0.001"])))
    arr = cfg.actor_rollout_ref
    assert (cfg.data.train_batch_size, arr.rollout.n, cfg.data.max_response_length) == (64, 8, 256)
    assert arr.actor.ppo_mini_batch_size == 64 and arr.actor.use_kl_loss and arr.actor.kl_loss_coef == 0.001
    assert arr.actor.use_dynamic_bsz and cfg.trainer.device == "cuda"
    assert arr.actor.ppo_max_token_len_per_gpu == 65536  # the update's budget; the no-grad passes take 4x
    assert arr.ref.log_prob_max_token_len_per_gpu == arr.rollout.log_prob_max_token_len_per_gpu == 4 * 65536
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == arr.rollout.dtype == "bfloat16"
    cfg = get_config(workload(_args(max_token_len=8192)))  # the user's budget: every pass
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 8192
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 8192
    cfg = get_config(workload(_args(device="cpu")))
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 4096


def test_trl_step_phases_from_wrapped_methods():
    class Accelerator:
        def backward(self, loss):
            time.sleep(0.01)

    class Trainer:
        accelerator = Accelerator()

        def _generate(self, prompts):
            time.sleep(0.02)
            return prompts

        def _generate_and_score_completions(self, batch):
            return self._generate(batch)

    trainer = Trainer()
    totals = time_methods(trainer, sync=lambda: None)
    assert trainer._generate_and_score_completions([1]) == [1]
    trainer.accelerator.backward(None)
    assert totals["score"] >= totals["generate"] >= 0.02 and totals["backward"] >= 0.01
    p = phases({"generate": 3.0, "reward": 0.5, "score": 4.0, "loss_fwd": 1.0, "backward": 2.0}, step_s=8.0)
    assert (p["logprob_s"], p["other_s"]) == (0.5, 1.0)
    assert math.isnan(phases({}, 1.0)["backward_s"])  # a method the installed TRL lacks: not measured


def test_trl_prompts_and_reward_are_hybrid_rls(tmp_path):
    from hybrid_rl.trainer import get_config

    rows = dataset_rows(get_config([f"data.arithmetic.cache_dir={tmp_path}"]))
    assert rows and rows[0]["data_source"] == "arithmetic"
    assert [m["role"] for m in rows[0]["prompt"]] == ["user", "assistant", "user"]  # one solved demonstration
    answer = rows[0]["ground_truth"]
    completions = [[{"role": "assistant", "content": f"#### {answer}"}], [{"role": "assistant", "content": "no"}]]
    assert arithmetic_reward(completions, [answer] * 2, ["arithmetic"] * 2) == [1.0, 0.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_monitor_sees_an_allocation():
    torch.cuda.empty_cache()  # else the 1 GiB may come from blocks an earlier test left cached
    monitor = GpuMemoryMonitor()
    block = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    assert monitor.take_step_peak() >= monitor.baseline + 2**30 - 2**20
    del block


@pytest.mark.slow
def test_cpu_smoke_run_prints_and_writes_every_figure(tmp_path, tiny_model_dir):
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_gpu.py"), "--device", "cpu", "--model-dir",
           tiny_model_dir, "--json", str(out), f"data.arithmetic.cache_dir={tmp_path}/data"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.path.abspath(REPO)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("median step: ")
    result = json.loads(out.read_text())
    assert len(result["steps"]) == 2 and result["model"] == "tiny" and result["device"] == "cpu"
    med = result["median"]
    for key in ("step_s", "gen_s", "ref_s", "update_actor_s", "gen_tok_s", "ref_gflops", "update_actor_gflops"):
        assert med[key] > 0, key
    # a CPU peak the quick measurement gave up on (emulated, or a loaded machine) is None and its MFU NaN
    for dtype, peak in result["peak_flops"].items():
        assert (med[f"update_actor_mfu_{dtype}"] > 0) if peak else math.isnan(med[f"update_actor_mfu_{dtype}"])
    assert result["peak_rss_gib"] > 0 and result["params"]["body"] > 0
    # the warm-up step is left out of the steady peaks; PSS never exceeds RSS (shared pages divided)
    assert 0 < result["steady_rss_gib"] <= result["peak_rss_gib"]
    assert 0 < result["peak_pss_gib"] <= result["peak_rss_gib"] + 1e-9
    assert any("bench_gpu.py" in row["command"] for row in result["peak_rss_top"])  # the driver itself


def test_the_teacher_pass_is_a_timed_part_of_the_step():
    m = {"perf/total_num_tokens": 1000, "response_length/mean": 10.0, "timing_s/step": 4.0, "timing_s/gen": 1.0,
         "timing_s/teacher": 0.75, "timing_s/update_actor": 2.0, "timing_s/compute_teacher_log_prob_worker": 0.5}
    f = step_figures(m, (10**6, 10**5), rows=20, peaks={"float32": 1e10}, dtype="float32")
    assert f["teacher_s"] == 0.75 and "teacher_gflops" not in f  # another model's size: timed only
    assert f["overhead_s"] == pytest.approx(0.25) and f["dispatch_s"] == pytest.approx(0.25)
