"""Teachers score at temperature 1 whatever the rollout samples at (veRL 0.9.1's teacher: its vLLM
``prompt_logprobs`` are taken at T=1); the student's own log-probs stay at the rollout temperature."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid_rl.single_controller import RayClassWithInitArgs
from hybrid_rl.single_controller.local import LocalWorkerGroup
from hybrid_rl.utils.testing import build_tiny_model_dir
from hybrid_rl.workers.config import ActorRolloutRefConfig
from hybrid_rl.workers.distillation_config import DistillationConfig, DistillationLossConfig, TeacherModelConfig
from hybrid_rl.workers.fsdp_workers import ActorRolloutRefWorker
from hybrid_rl.workers.teacher import TEACHER_TEMPERATURE
from tests.workers.helpers import hf_response_log_probs, make_batch

ROLLOUT_TEMPERATURE = 0.5


@pytest.fixture(autouse=True)
def _own_rendezvous(monkeypatch):
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("loss_mode", ["k3", "forward_kl_topk"])
def test_teacher_scores_at_temperature_one_not_the_rollouts(tiny_model_dir, tmp_path, loss_mode):
    teacher_dir = build_tiny_model_dir(tmp_path / "teacher", seed=1)
    config = ActorRolloutRefConfig()
    config.model.path = tiny_model_dir
    config.rollout.temperature = ROLLOUT_TEMPERATURE
    config.rollout.n = 1
    config.actor.ppo_mini_batch_size = 4
    distillation = DistillationConfig(
        enabled=True, teacher_models={"teacher_model": TeacherModelConfig(model_path=teacher_dir, dtype="float32")},
        distillation_loss=DistillationLossConfig(loss_mode=loss_mode, topk=4))
    group = LocalWorkerGroup(RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role="actor_ref",
                                                  distillation=distillation))
    group.init_model()
    try:
        data = make_batch(num_rows=4, vocab=300)
        meta = dict(data.meta_info)
        out = group.compute_teacher_log_prob(data).batch
        mask = data.batch["response_mask"].bool()
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
        at_one, at_rollout = (hf_response_log_probs(teacher, data, t)[mask] for t in (1.0, ROLLOUT_TEMPERATURE))
        assert TEACHER_TEMPERATURE == 1.0
        torch.testing.assert_close(out["teacher_log_prob"][mask], at_one, rtol=1e-5, atol=1e-5)
        assert (out["teacher_log_prob"][mask] - at_rollout).abs().max() > 1e-2  # T=0.5 would differ
        if loss_mode == "forward_kl_topk":
            b = data.batch
            with torch.no_grad():
                logits = teacher(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 position_ids=b["position_ids"]).logits
            r = b["responses"].shape[1]
            top = torch.log_softmax(logits[:, -r - 1:-1].float(), dim=-1).topk(4, dim=-1)  # T=1
            torch.testing.assert_close(out["teacher_topk_log_probs"][mask], top.values[mask], rtol=1e-5, atol=1e-5)
        assert data.meta_info == meta  # the caller's batch keeps its own meta_info
    finally:
        group.shutdown()
