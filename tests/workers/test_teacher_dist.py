"""Several distillation teachers on 2 gloo ranks (FSDP2), with one teacher's rows all on one rank and
the other teacher's split unevenly: every rank still runs every teacher's passes (workers/teacher.py
``rows_on_every_rank``), so the collectives meet, and the scores equal the 1-rank run's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid_rl.single_controller import RayClassWithInitArgs
from hybrid_rl.single_controller.local import LocalWorkerGroup
from hybrid_rl.utils.testing import build_tiny_model_dir
from hybrid_rl.workers.config import ActorRolloutRefConfig
from hybrid_rl.workers.distillation_config import DistillationConfig, DistillationLossConfig, TeacherModelConfig
from hybrid_rl.workers.fsdp_workers import ActorRolloutRefWorker
from hybrid_rl.workers.teacher import route_rows
from tests.workers.dist_helpers import run_ranks
from tests.workers.helpers import make_batch

pytestmark = pytest.mark.timeout(600)

# rank 0 gets rows 0-3: three "gsm8k" and one "arithmetic"; rank 1 gets rows 4-7: four "arithmetic".
# So the "gsm8k" teacher has rows on rank 0 only, and "arithmetic" has 1 row on rank 0 and 4 on rank 1
# (1 vs 2 micro-batches of 3 rows; 1 vs 2+ token-budget micro-batches under dynamic batch size).
SOURCES = ["gsm8k", "gsm8k", "gsm8k", "arithmetic", "arithmetic", "arithmetic", "arithmetic", "arithmetic"]
CASES = {"fixed_k3": dict(dynamic=False, loss=DistillationLossConfig()),
         "dynamic_topk": dict(dynamic=True, loss=DistillationLossConfig(loss_mode="forward_kl_topk", topk=4))}


@pytest.fixture(autouse=True)
def _own_rendezvous(monkeypatch):
    """The in-process worker sets MASTER_ADDR/PORT for its group; undo it so later runs pick their own."""
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def _data():
    data = make_batch(num_rows=len(SOURCES), vocab=300)
    data.non_tensor_batch["data_source"] = np.array(SOURCES, dtype=object)
    return data


def _worker_args(student_dir: str, teacher_dir: str, case: str, world: int) -> dict:
    config = ActorRolloutRefConfig()
    config.model.path = student_dir
    config.ref.log_prob_micro_batch_size_per_gpu = 3
    config.ref.log_prob_use_dynamic_bsz = CASES[case]["dynamic"]
    config.ref.log_prob_max_token_len_per_gpu = 16  # rows have up to 11 tokens: 1-2 rows per micro-batch
    teachers = {"math": TeacherModelConfig(key="gsm8k", model_path=teacher_dir, dtype="float32"),
                "self": TeacherModelConfig(key="arithmetic", model_path=student_dir, dtype="float32")}
    distillation = DistillationConfig(enabled=True, teacher_key="data_source", teacher_models=teachers,
                                      distillation_loss=CASES[case]["loss"], nnodes=1, n_gpus_per_node=world)
    return dict(config=config, role="teacher", distillation=distillation)


def _two_rank_job(rank: int, world: int, student_dir: str, teacher_dir: str, out_path: str) -> None:
    results = {}
    for case in CASES:
        worker = ActorRolloutRefWorker(**_worker_args(student_dir, teacher_dir, case, world))
        worker.init_model()
        results[case] = dict(worker.compute_teacher_log_prob(_data().chunk(world)[rank]).batch.items())
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        torch.save({case: {key: torch.cat([g[case][key] for g in gathered]) for key in results[case]}
                    for case in CASES}, out_path)


def _one_rank(student_dir: str, teacher_dir: str, case: str) -> dict:
    group = LocalWorkerGroup(RayClassWithInitArgs(ActorRolloutRefWorker,
                                                  **_worker_args(student_dir, teacher_dir, case, 1)))
    try:
        group.init_model()
        return dict(group.compute_teacher_log_prob(_data()).batch.items())
    finally:
        group.shutdown()


def test_two_ranks_with_one_teachers_rows_on_one_rank_finish_and_equal_one_rank(tiny_model_dir, tmp_path):
    teacher_dir = build_tiny_model_dir(tmp_path / "teacher", seed=1)
    out = tmp_path / "two_ranks.pt"
    run_ranks(_two_rank_job, 2, tiny_model_dir, teacher_dir, str(out))
    two = torch.load(out, weights_only=True)
    mask = _data().batch["response_mask"]
    for case in CASES:
        one = _one_rank(tiny_model_dir, teacher_dir, case)
        assert sorted(two[case]) == sorted(one), case
        got, expected = two[case]["teacher_log_prob"] * mask, one["teacher_log_prob"] * mask
        assert (expected.abs().sum(1) > 0).all(), case  # every row was scored by its teacher
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=case)
        if "teacher_topk_ids" in one:
            m = mask.bool()
            assert torch.equal(two[case]["teacher_topk_ids"][m], one["teacher_topk_ids"][m]), case
            torch.testing.assert_close(two[case]["teacher_topk_log_probs"][m], one["teacher_topk_log_probs"][m],
                                       rtol=1e-5, atol=1e-5, msg=case)


# A row whose teacher key matches no teacher on rank 1 only ("orphan" is the last of the 8 rows). Rank 1
# alone raising would leave rank 0 waiting in rows_on_every_rank's all-reduce (a hang under Ray until the
# collective timeout): the ranks agree on a flag first, and both raise the same one-line error.
ORPHAN_SOURCES = SOURCES[:7] + ["orphan"]
ORPHAN_ERROR = "distillation: rows with data_source=['orphan'] have no teacher (keys: ['gsm8k', 'arithmetic'])"


def _orphan_data():
    data = make_batch(num_rows=len(ORPHAN_SOURCES), vocab=300)
    data.non_tensor_batch["data_source"] = np.array(ORPHAN_SOURCES, dtype=object)
    return data


def _record_error(rank: int, out_dir: str, call) -> None:
    try:
        call()
        message = "no error"
    except ValueError as error:
        message = str(error)
    with open(f"{out_dir}/rank{rank}.txt", "w") as f:
        f.write(message)


def _route_job(rank: int, world: int, out_dir: str) -> None:
    teachers = _worker_args("s", "t", "fixed_k3", world)["distillation"].teacher_models
    _record_error(rank, out_dir, lambda: route_rows(_orphan_data().chunk(world)[rank], teachers, "data_source", "cpu"))


def _worker_job(rank: int, world: int, student_dir: str, teacher_dir: str, out_dir: str) -> None:
    worker = ActorRolloutRefWorker(**_worker_args(student_dir, teacher_dir, "fixed_k3", world))
    worker.init_model()
    _record_error(rank, out_dir, lambda: worker.compute_teacher_log_prob(_orphan_data().chunk(world)[rank]))


def _messages(out_dir) -> list[str]:
    return [(out_dir / f"rank{rank}.txt").read_text() for rank in range(2)]


def test_a_teacherless_row_on_one_rank_makes_every_rank_raise_the_same_error(tmp_path):
    run_ranks(_route_job, 2, str(tmp_path))
    first, second = _messages(tmp_path)
    assert first == second and first.startswith(ORPHAN_ERROR), (first, second)


def test_a_teacherless_row_on_one_rank_stops_both_workers_instead_of_hanging(tiny_model_dir, tmp_path):
    teacher_dir = build_tiny_model_dir(tmp_path / "teacher", seed=1)
    run_ranks(_worker_job, 2, tiny_model_dir, teacher_dir, str(tmp_path))
    first, second = _messages(tmp_path)
    assert first == second and first.startswith(ORPHAN_ERROR), (first, second)
