"""The teacher role (workers/teacher.py) and the actor's distillation term (objectives/distillation.py):
teacher log-probs equal a plain transformers forward of the teacher, rows go to their teacher, and
the term enters the loss as configured."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid_rl.single_controller import RayClassWithInitArgs
from hybrid_rl.single_controller.local import LocalWorkerGroup
from hybrid_rl.utils.testing import build_tiny_model_dir
from hybrid_rl.workers.config import ActorRolloutRefConfig
from hybrid_rl.objectives import MicroBatch, Objective, WeightedSum
from hybrid_rl.objectives.distillation import DistillationTerm, DistillationTermConfig
from hybrid_rl.workers.distillation_config import DistillationConfig, DistillationLossConfig, TeacherModelConfig
from hybrid_rl.workers.fsdp_workers import ActorRolloutRefWorker
from hybrid_rl.workers.teacher import route_rows
from tests.workers.helpers import hf_response_log_probs, make_batch


TEMPERATURE = 1.0
"""Teachers score at temperature 1 as veRL's (the rollout's default, 0.8, is not theirs:
tests/workers/test_teacher_temperature.py)."""


@pytest.fixture(autouse=True)
def _own_rendezvous(monkeypatch):
    """The in-process worker sets MASTER_ADDR/PORT for its group; undo it so later runs pick their own."""
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("teacher"), seed=1)


def _group(student_dir, teachers, teacher_key="data_source", loss=None):
    """Callers comparing a teacher with an fp32 forward give it ``dtype="float32"``: ``auto`` is
    bf16 on a CPU where bf16 is fast."""
    config = ActorRolloutRefConfig()
    config.model.path = student_dir
    config.actor.ppo_mini_batch_size = 4
    config.rollout.n = 1
    config.ref.log_prob_micro_batch_size_per_gpu = 3  # several micro-batches, rows in another order
    distillation = DistillationConfig(enabled=True, teacher_key=teacher_key, teacher_models=teachers,
                                      distillation_loss=loss or DistillationLossConfig())
    group = LocalWorkerGroup(RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role="actor_ref",
                                                  distillation=distillation))
    group.init_model()
    return group


def test_teacher_log_probs_equal_a_plain_transformers_forward(tiny_model_dir, teacher_dir):
    group = _group(tiny_model_dir, {"teacher_model": TeacherModelConfig(model_path=teacher_dir, dtype="float32")})
    try:
        data = make_batch(num_rows=7, vocab=300)
        got = group.compute_teacher_log_prob(data).batch["teacher_log_prob"]
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
        expected = hf_response_log_probs(teacher, data, TEMPERATURE) * data.batch["response_mask"]
        torch.testing.assert_close(got * data.batch["response_mask"], expected, rtol=1e-5, atol=1e-5)
        student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        assert not torch.allclose(got, hf_response_log_probs(student, data, TEMPERATURE), atol=1e-3)  # not the student's
    finally:
        group.shutdown()


def test_several_teachers_each_score_their_rows(tiny_model_dir, teacher_dir):
    teachers = {"math": TeacherModelConfig(key="gsm8k", model_path=teacher_dir, dtype="float32"),
                "self": TeacherModelConfig(key="arithmetic", model_path=tiny_model_dir, dtype="float32")}
    group = _group(tiny_model_dir, teachers)
    try:
        data = make_batch(num_rows=6, vocab=300)
        data.non_tensor_batch["data_source"] = np.array(["gsm8k", "arithmetic"] * 3, dtype=object)
        got = group.compute_teacher_log_prob(data).batch["teacher_log_prob"] * data.batch["response_mask"]
        mask = data.batch["response_mask"]
        for path, rows in ((teacher_dir, [0, 2, 4]), (tiny_model_dir, [1, 3, 5])):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            expected = hf_response_log_probs(model, data, TEMPERATURE) * mask
            torch.testing.assert_close(got[rows], expected[rows], rtol=1e-5, atol=1e-5)
        data.non_tensor_batch["data_source"][0] = "unseen"
        with pytest.raises(ValueError, match=r"data_source=\['unseen'\] have no teacher"):
            group.compute_teacher_log_prob(data)
    finally:
        group.shutdown()


def test_route_rows_takes_every_row_for_one_teacher_and_needs_the_field_for_several():
    data = make_batch(num_rows=3)
    one = {"t": TeacherModelConfig(model_path="x")}
    assert route_rows(data, one, "data_source")["t"].tolist() == [0, 1, 2]
    two = {"a": TeacherModelConfig(key="p", model_path="x"), "b": TeacherModelConfig(key="q", model_path="y")}
    with pytest.raises(ValueError, match="distillation.teacher_key='data_source': the rows have no such field"):
        route_rows(data, two, "data_source")


class _Policy(Objective):
    """A stand-in policy term: a fixed loss 0.3."""

    summed = ("actor/pg_loss",)

    def __call__(self, mb):
        return torch.tensor(0.3), {}


def test_distillation_term_enters_the_loss_as_configured():
    log_prob = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    batch = {"teacher_log_prob": torch.tensor([[-1.5, -1.0, -9.0]]), "response_mask": torch.tensor([[1, 1, 0]])}
    agg = {"loss_agg_mode": "token-mean", "global_batch_num_tokens": None, "global_batch_num_seqs": None}
    mb = MicroBatch(batch, log_prob, agg, on_policy=True)
    # k3 per token: r = t - s = [-0.5, 1.0]: e^r - r - 1 = [e^-0.5 - 0.5, e - 2]; token mean over 2
    k3 = (np.exp(-0.5) - 0.5 + np.e - 2) / 2
    term = DistillationTerm(DistillationTermConfig.from_settings(DistillationLossConfig(distillation_loss_coef=0.5)))
    value, stats = term(mb)
    assert value.item() == pytest.approx(k3, rel=1e-6)
    assert stats["actor/distillation/loss"].item() == pytest.approx(k3, rel=1e-6)
    total, _ = WeightedSum([(_Policy(), 1.0), (term, 0.5)])(mb)
    assert total.item() == pytest.approx(0.3 + 0.5 * k3, rel=1e-6)
    alone, _ = WeightedSum([(_Policy(), 0.0), (term, 1.0)])(mb)
    assert alone.item() == pytest.approx(k3, rel=1e-6)  # the policy loss and the coefficient drop out
    assert stats["actor/distillation/teacher_log_prob"].item() == pytest.approx(-1.25)
    assert stats["actor/distillation/loss_max"].item() == pytest.approx(np.e - 2, rel=1e-6)
    assert stats["actor/distillation/abs_loss"].item() == pytest.approx(k3, rel=1e-6)  # the masked token is out


def test_distillation_alone_moves_the_student_towards_the_teacher(tiny_model_dir, teacher_dir):
    """Twelve updates on one fixed batch with the k3 loss only: the student's KL to the teacher falls."""
    from hybrid_rl.workers.actor import DataParallelPPOActor
    from hybrid_rl.workers.model_loader import load_causal_lm
    from tests.workers.helpers import actor_config

    torch.manual_seed(0)
    student = load_causal_lm(tiny_model_dir, dtype="float32")
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    data = make_batch(num_rows=8, vocab=300)
    data.batch["teacher_log_prob"] = hf_response_log_probs(teacher, data, 1.0)
    data.batch["advantages"] = torch.zeros_like(data.batch["teacher_log_prob"])
    data.meta_info["temperature"] = 1.0
    cfg = actor_config(optim=actor_config().optim)
    optim = torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=0.0)
    actor = DataParallelPPOActor(cfg, student, optim, use_remove_padding=True,
                                 distillation=DistillationLossConfig(use_task_rewards=False))
    kls = [actor.update_policy(data)["actor/distillation/teacher_kl"][0] for _ in range(12)]
    assert kls[-1] < 0.7 * kls[0], kls


def _hf_log_softmax(model, data, temperature):
    """[B, R, V] log-softmax at the positions predicting the responses (plain transformers)."""
    b = data.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits
    r = b["responses"].shape[1]
    return torch.log_softmax(logits[:, -r - 1:-1].float() / temperature, dim=-1)


def test_teacher_topk_equals_a_plain_transformers_forward(tiny_model_dir, teacher_dir):
    group = _group(tiny_model_dir, {"teacher_model": TeacherModelConfig(model_path=teacher_dir, dtype="float32")},
                   loss=DistillationLossConfig(loss_mode="forward_kl_topk", topk=5))
    try:
        data = make_batch(num_rows=7, vocab=300)
        out = group.compute_teacher_log_prob(data).batch
        mask = data.batch["response_mask"].bool()
        top = _hf_log_softmax(AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32), data,
                              TEMPERATURE).topk(5, dim=-1)
        torch.testing.assert_close(out["teacher_topk_log_probs"][mask], top.values[mask], rtol=1e-5, atol=1e-5)
        assert torch.equal(out["teacher_topk_ids"][mask], top.indices[mask])
        assert tuple(out["teacher_topk_ids"].shape) == (7, 5, 5)
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
        sampled = hf_response_log_probs(teacher, data, TEMPERATURE)  # comes with the top-K
        torch.testing.assert_close(out["teacher_log_prob"][mask], sampled[mask], rtol=1e-5, atol=1e-5)
    finally:
        group.shutdown()


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_student_log_probs_at_the_teachers_ids_with_gradient(tiny_model_dir, packed):
    from hybrid_rl.workers.topk_forward import response_log_probs_with_topk

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    data = make_batch(num_rows=5, vocab=300)
    ids = torch.randint(0, 300, (5, 5, 4), generator=torch.Generator().manual_seed(3))
    batch = dict(data.batch.items())
    log_prob, entropy, topk = response_log_probs_with_topk(model, batch, 0.7, ids, packed, entropy_grad=False)
    full = _hf_log_softmax(model, data, 0.7)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(topk[mask], full.gather(-1, ids)[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_prob[mask], full.gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1)[mask],
                               rtol=1e-5, atol=1e-5)
    assert entropy.shape == log_prob.shape and topk.shape == (5, 5, 4)
    topk[mask].sum().backward()
    assert model.lm_head.weight.grad is not None or model.model.embed_tokens.weight.grad is not None


def test_topk_distillation_moves_the_student_towards_the_teacher(tiny_model_dir, teacher_dir):
    """Twelve forward_kl_topk-only updates on one fixed batch: the top-K forward KL falls."""
    from hybrid_rl.workers.actor import DataParallelPPOActor
    from hybrid_rl.workers.model_loader import load_causal_lm
    from tests.workers.helpers import actor_config

    torch.manual_seed(0)
    student = load_causal_lm(tiny_model_dir, dtype="float32")
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    data = make_batch(num_rows=8, vocab=300)
    full = _hf_log_softmax(teacher, data, 1.0)
    top = full.topk(8, dim=-1)
    data.batch.update({"teacher_topk_log_probs": top.values, "teacher_topk_ids": top.indices,
                       "teacher_log_prob": full.gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1),
                       "advantages": torch.zeros(data.batch["responses"].shape)})
    data.meta_info["temperature"] = 1.0
    optim = torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=0.0)
    actor = DataParallelPPOActor(actor_config(), student, optim, use_remove_padding=True,
                                 distillation=DistillationLossConfig(loss_mode="forward_kl_topk", topk=8,
                                                                     use_task_rewards=False))
    losses = [actor.update_policy(data)["actor/distillation/loss"][0] for _ in range(12)]
    assert losses[-1] < 0.7 * losses[0], losses
