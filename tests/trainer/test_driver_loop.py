"""The driver loop (fit, named steps, checkpoints, resume, logging) with in-process fake workers."""

import json
import os

import pytest

from hybrid_rl.trainer.config.loader import get_config
from hybrid_rl.trainer.core.worker_groups import WorkerGroups
from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

from trainer_fakes import FakeActorRollout, FakeCritic, FakePool


def _overrides(tmp_path, model_dir, *extra):
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.arithmetic.cache_dir={tmp_path}/data",
        "data.arithmetic.num_train=40",
        "data.arithmetic.num_test=6",
        "data.arithmetic.num_shots=0",
        "data.train_batch_size=4",
        "data.max_response_length=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=5",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}/run",
        "trainer.progress_bar=false",
        *extra,
    ]


def _trainer(tmp_path, model_dir, *extra, critic=False):
    trainer = RayPPOTrainer(get_config(_overrides(tmp_path, model_dir, *extra)))
    trainer.workers = WorkerGroups(FakeActorRollout(), FakeCritic() if critic else None, FakePool())
    return trainer


def _rows(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def test_grpo_loop_steps_metrics_checkpoints(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir)
    trainer.fit()
    calls = trainer.workers.actor_rollout.calls
    # val before train, 5 x (generate, log-prob, update), final validation; saves at 2, 4, 5
    assert calls.count("update_actor") == 5 and calls.count("generate_sequences") == 7
    assert calls.count("compute_ref_log_prob") == 0 and calls.count("save_checkpoint") == 3
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert "val-core/arithmetic/reward/mean@1" in rows[0] and "val-core/arithmetic/reward/mean@1" in rows[-1]
    step = rows[1]
    for key in ("critic/score/mean", "critic/advantages/mean", "response_length/clip_ratio", "perf/throughput",
                "timing_s/generate", "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/mfu/actor",
                "task_reward", "actor_clip_ratio", "no_eos_ratio", "avg_seq_len", "reward/num_failed",
                "actor/entropy", "rollout/fake"):
        assert key in step, key
    assert "timing_s/save_checkpoint" in rows[2] and "timing_s/save_checkpoint" not in rows[3]
    run = tmp_path / "run"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert sorted(p for p in os.listdir(run) if p.startswith("global_step")) == ["global_step_4", "global_step_5"]
    assert (run / "reward_curve.png").stat().st_size > 0 and (run / "val_generations.jsonl").exists()


def test_resume_reaches_same_final_weights(tmp_path, tiny_model_dir):
    straight = _trainer(tmp_path / "a", tiny_model_dir)
    straight.fit()

    interrupted = _trainer(tmp_path / "b", tiny_model_dir, "trainer.total_training_steps=5")
    interrupted.total_training_steps = 3  # "killed" after step 3 (last checkpoint: step 2)
    interrupted.config.trainer.save_freq = 2
    interrupted._is_last_step = lambda: False  # no final save / validation, as in a crash
    interrupted.fit()
    assert (tmp_path / "b" / "run" / "latest_checkpointed_iteration.txt").read_text() == "2"

    resumed = _trainer(tmp_path / "b", tiny_model_dir)
    resumed.fit()
    assert resumed.workers.actor_rollout.calls[0] == "load_checkpoint"
    assert float(resumed.workers.actor_rollout.w) == float(straight.workers.actor_rollout.w)
    steps = [r["step"] for r in _rows(tmp_path / "b" / "run")]
    assert steps == [0, 1, 2, 3, 3, 4, 5]  # step 3 redone after resuming from 2


def test_gae_with_kl_in_reward_and_critic_warmup(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
                       "trainer.critic_warmup=2", "trainer.val_before_train=false", critic=True)
    assert trainer.step_plan()[:7] == ["generate", "compute_reward", "compute_old_log_prob", "compute_ref_log_prob",
                                       "compute_values", "compute_advantage", "update_critic"]
    trainer.fit()
    assert trainer.workers.actor_rollout.calls.count("update_actor") == 3  # steps 3..5
    assert trainer.workers.critic.calls.count("update_critic") == 5
    row = _rows(tmp_path / "run")[0]
    assert "actor/reward_kl_penalty" in row and "critic/vf_explained_var" in row and "critic/values/mean" in row
    assert os.path.isdir(tmp_path / "run" / "global_step_5" / "critic")


def test_resume_path_errors(tmp_path, tiny_model_dir):
    # Checked when the trainer is built (core/runtime_checks.py), before any worker starts.
    with pytest.raises(ValueError, match="not a global_step_N folder"):
        _trainer(tmp_path, tiny_model_dir, "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={tmp_path}/run/global_step_9")


def test_cpu_workers_get_a_short_openmp_spin_unless_the_user_chose():
    from hybrid_rl.utils.cpu_env import CPU_OPENMP_SPINCOUNT, cpu_openmp_env

    assert cpu_openmp_env({}) == {"GOMP_SPINCOUNT": CPU_OPENMP_SPINCOUNT}
    assert cpu_openmp_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_openmp_env({"OMP_WAIT_POLICY": ""}) == {"OMP_WAIT_POLICY": ""}  # the runtime's default
    assert cpu_openmp_env({"GOMP_SPINCOUNT": "0", "PATH": "/bin"}) == {"GOMP_SPINCOUNT": "0"}


def test_cpu_workers_keep_freed_memory_unless_the_user_configures_the_allocator():
    from hybrid_rl.utils.cpu_env import CPU_MALLOC_ENV, cpu_malloc_env, cpu_worker_env

    assert CPU_MALLOC_ENV == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
    assert cpu_malloc_env({"PATH": "/bin"}) == CPU_MALLOC_ENV
    assert cpu_malloc_env({"MALLOC_ARENA_MAX": "2"}) == {"MALLOC_ARENA_MAX": "2"}
    tcmalloc = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}
    assert cpu_malloc_env(tcmalloc) == tcmalloc
    thp = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert cpu_malloc_env(thp) == thp
    both = cpu_worker_env({"OMP_WAIT_POLICY": "PASSIVE"})
    assert both == {"OMP_WAIT_POLICY": "PASSIVE", **CPU_MALLOC_ENV}


def test_cpu_workers_get_rays_jemalloc_when_asked(monkeypatch, caplog):
    import os

    from hybrid_rl.utils import cpu_env

    path = cpu_env.bundled_jemalloc()
    if path is None:
        pytest.skip("this Ray wheel ships no libjemalloc.so (non-Linux)")
    assert os.path.isfile(path) and path.endswith(os.path.join("ray", "core", "libjemalloc.so"))
    jemalloc = {"LD_PRELOAD": path, "MALLOC_CONF": cpu_env.JEMALLOC_CONF}
    assert cpu_env.cpu_malloc_env({}, "jemalloc") == jemalloc
    assert cpu_env.cpu_malloc_env({}, "glibc") == cpu_env.cpu_malloc_env({}) == cpu_env.CPU_MALLOC_ENV
    assert cpu_env.cpu_malloc_env({"MALLOC_CONF": "narenas:1"}, "jemalloc") == {"MALLOC_CONF": "narenas:1"}  # the user's
    with pytest.raises(ValueError, match="trainer.cpu_allocator='tcmalloc' is invalid"):
        cpu_env.cpu_malloc_env({}, "tcmalloc")
    monkeypatch.setattr(cpu_env, "bundled_jemalloc", lambda: None)  # e.g. macOS
    with caplog.at_level("WARNING"):
        assert cpu_env.cpu_malloc_env({}, "jemalloc") == cpu_env.CPU_MALLOC_ENV
    assert "libjemalloc.so was not found" in caplog.text


def test_cpu_allocator_auto_takes_jemalloc_where_ray_ships_it():
    from hybrid_rl.utils import cpu_env

    assert cpu_env.resolve_cpu_allocator("auto") == "jemalloc"
    assert cpu_env.resolve_cpu_allocator("glibc") == "glibc"  # an explicit choice stands
    if cpu_env.bundled_jemalloc():
        assert cpu_env.cpu_malloc_env({}, "auto")["MALLOC_CONF"] == cpu_env.JEMALLOC_CONF
    else:
        assert cpu_env.cpu_malloc_env({}, "auto") == cpu_env.CPU_MALLOC_ENV
    assert cpu_env.cpu_malloc_env({}, "glibc") == cpu_env.CPU_MALLOC_ENV
    assert cpu_env.cpu_malloc_env({"MALLOC_ARENA_MAX": "2"}, "auto") == {"MALLOC_ARENA_MAX": "2"}
    with pytest.raises(ValueError, match="trainer.cpu_allocator='small' is invalid.*Fix: use auto"):
        cpu_env.resolve_cpu_allocator("small")


def test_gdpo_reads_the_scorers_reward_components(tmp_path, tiny_model_dir):
    """gdpo normalises each component the scorer returns in its dict (reward_extra_<key> columns)."""
    reward = tmp_path / "parts.py"
    reward.write_text("def parts(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {'score': 0.0, 'acc': float(len(solution_str) % 2), 'short': -len(solution_str)}\n")
    base = ["algorithm.adv_estimator=gdpo", f"custom_reward_function.path={reward}", "custom_reward_function.name=parts",
            "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.val_at_end=false"]
    trainer = _trainer(tmp_path, tiny_model_dir, *base, "algorithm.gdpo_reward_keys=[acc,short]",
                       "algorithm.gdpo_reward_weights=[1.0,0.5]")
    batch = trainer.compute_reward(trainer.generate(_first_batch(trainer), {}), {})
    out = trainer.compute_advantage(batch, {})
    assert out.batch["advantages"].abs().sum() > 0  # the score is 0 everywhere: only the components move it
    missing = _trainer(tmp_path / "b", tiny_model_dir, *base, "algorithm.gdpo_reward_keys=[nope]")
    keys = r"names 'nope', which the scorer does not return \(its dict keys: \['acc', 'score', 'short'\]"
    with pytest.raises(ValueError, match=keys):
        missing.compute_advantage(missing.compute_reward(missing.generate(_first_batch(missing), {}), {}), {})


def _first_batch(trainer):
    from hybrid_rl.protocol import DataProto

    return DataProto.from_single_dict(next(iter(trainer.train_dataloader)))


def test_dynamic_sampling_takes_more_prompt_batches_from_the_stream(tmp_path, tiny_model_dir):
    """filter_groups refills a step from the training stream; the loader's position (what a checkpoint
    saves) counts every batch taken, and the overlong penalty shows in its metrics."""
    trainer = _trainer(tmp_path, tiny_model_dir, "algorithm.filter_groups.enable=true",
                       "algorithm.filter_groups.metric=acc", "algorithm.filter_groups.max_num_gen_batches=3",
                       "trainer.total_training_steps=2", "trainer.val_before_train=false",
                       "trainer.val_at_end=false", "reward_model.overlong_buffer.enable=true",
                       "reward_model.overlong_buffer.len=2", "reward_model.overlong_buffer.log=true")
    plan = trainer.step_plan()
    assert plan.index("compute_reward") + 1 == plan.index("filter_groups")
    trainer.fit()
    rows = _rows(tmp_path / "run")
    taken = [r["train/num_gen_batches"] for r in rows]
    assert all(1 <= t <= 3 for t in taken) and "reward/overlong_frac" in rows[0]
    assert trainer.train_dataloader.state_dict()["batch_in_epoch"] == sum(taken)  # 10 batches per epoch
    calls = trainer.workers.actor_rollout.calls
    assert calls.count("generate_sequences") == sum(taken) and calls.count("update_actor") == 2
    assert all(r["train/filter_groups/kept_frac"] <= 1 for r in rows)
